"""How far the low-rank magnitude solver is from the exact one.

For key sets of T keys in R^d (families below), r landmarks, and each causal quantity, the distribution over
positions (median, 95th percentile, max) of the absolute error against the exact Cholesky forms of
:mod:`attnlab.mechanisms.magnitude.reference` at the same t and eps:

    w      |w_j - w_j exact|          key j's weight inside its own prefix (the "causal" gate's input)
    M      |M_ij - M_ij exact|, j <= i  key j's weight inside query i's prefix (the "prefix" gate's input)
    gate   |g(w_j) - g(w_j exact)|    for the default clamp gate and the linear gate at beta = 1, gamma = 0

Families: ``iid`` (N(0, 1) coordinates), ``rank-4`` (4 latent N(0, 1) factors through a random 4 x d map / 2,
the notes' ill-conditioned case) and ``clustered`` (16 centres N(0, 1), each key its centre + N(0, 0.3^2) noise).
Landmarks: ``init`` (N(0, 0.5^2), what a model starts from) and ``sampled`` (r more keys drawn with the key set,
from the same centres or subspace but not among the keys compared: landmarks placed where keys are, as training
can move them).

The keys of trained models (``--trained RUN_DIR ...``, :func:`trained_rows`): each run's keys at every magnitude
gate on its first validation windows, at the gate's learned t and the run's eps, pooled over layers; landmarks
``init``, ``sampled`` (keys of later validation windows at the same gate) and, for a run trained with the low-rank
solver, ``trained`` (its own learned landmarks, at its own rank).

    python -m attnlab.experiments.lowrank_error --out results/magnitude-lowrank/error.json
    python -m attnlab.experiments.lowrank_error --trained runs/keys-exact runs/keys-lowrank \
        --out results/magnitude-lowrank/error_trained.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from ..data import prepare
from ..errors import ConfigError
from ..mechanisms.magnitude import reference as M
from ..mechanisms.magnitude.lowrank import LANDMARK_INIT_STD, lowrank_prefix, nystrom_features
from ..mechanisms.magnitude.lowrank import prefix_weight_matrix_lowrank
from ..mechanisms.magnitude.module import magnitude_gates
from ..train.trainer import load_run

__all__ = ["FAMILIES", "LANDMARKS", "error_rows", "error_table", "gate_keys", "keys_of", "main", "run",
           "trained_rows"]

FAMILIES = ("iid", "rank-4", "clustered")
LANDMARKS = ("init", "sampled")
GATES = ("clamp", "linear")


def keys_of(family: str, n_sets: int, n: int, d: int, generator: torch.Generator) -> torch.Tensor:
    """[n_sets, n, d] float64 keys of a family (module docstring)."""
    shape = (n_sets, n, d)
    if family == "iid":
        return torch.randn(shape, generator=generator, dtype=torch.float64)
    if family == "rank-4":
        factors = torch.randn(n_sets, n, 4, generator=generator, dtype=torch.float64)
        return factors @ torch.randn(n_sets, 4, d, generator=generator, dtype=torch.float64) / 2
    if family == "clustered":
        centres = torch.randn(n_sets, 16, d, generator=generator, dtype=torch.float64)
        which = torch.randint(0, 16, (n_sets, n), generator=generator)
        return torch.gather(centres, 1, which[..., None].expand(shape)) + 0.3 * torch.randn(
            shape, generator=generator, dtype=torch.float64)
    raise ValueError(f"family={family!r} is not allowed; choose one of: {', '.join(map(repr, FAMILIES))}")


def _summary(errors: torch.Tensor) -> dict:
    e = errors.flatten()
    q = torch.quantile(e, torch.tensor([0.5, 0.95], dtype=e.dtype))  # (torch.median takes the lower middle value)
    return {"median": float(q[0]), "p95": float(q[1]), "max": float(e.max())}


def _errors(keys: torch.Tensor, landmarks: torch.Tensor, t, eps: float, chunk: int) -> dict:
    """{"w_exact", "w", "M", "gate_clamp", "gate_linear"}: flat tensors of |w exact| and of the absolute errors
    (module docstring), in float64."""
    keys, landmarks = keys.double(), landmarks.double()
    L, y, _ = M.prefix_factor(M.similarity(keys, t), eps)
    w_exact, m_exact = M.own_prefix_weights_from_factor(L, y), M.prefix_weight_matrix_from_factor(L, y)
    phi, d = nystrom_features(keys, landmarks, t)
    w, _, c = lowrank_prefix(phi, d + eps, chunk)
    m = prefix_weight_matrix_lowrank(phi, d + eps, c)
    lower = torch.ones(keys.shape[-2], keys.shape[-2], dtype=torch.bool).tril()
    out = {"w_exact": w_exact.abs(), "w": (w - w_exact).abs(), "M": (m - m_exact).abs()[..., lower]}
    for gate in GATES:
        out[f"gate_{gate}"] = (M.gate(w, 1.0, 0.0, gate) - M.gate(w_exact, 1.0, 0.0, gate)).abs()
    return {key: value.flatten() for key, value in out.items()}


def error_rows(keys: torch.Tensor, landmarks: torch.Tensor, t: float = 1.0, eps: float = 1e-3, chunk: int = 64) -> dict:
    """{"w", "M", "gate_clamp", "gate_linear"}: each {"median", "p95", "max"} of the absolute error of the low-rank
    weights of ``keys`` [..., T, d] with ``landmarks`` [..., r, d] against the exact prefix forms, in float64; and
    "w_exact", the same statistics of |w exact| (the scale the errors compare with)."""
    return {key: _summary(value) for key, value in _errors(keys, landmarks, t, eps, chunk).items()}


def run(ranks=(16, 32, 64, 128), epss=(1e-3, 1e-2, 1e-1), n: int = 256, d: int = 64, n_sets: int = 4,
        t: float = 1.0, seed: int = 0, families=FAMILIES) -> list[dict]:
    """One row per family, landmark placement, rank r and eps (module docstring), with the scale of the exact
    weights beside the errors (``w_exact``: median, p95, max of |w_j exact|)."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    for family in families:
        both = keys_of(family, n_sets, n + max(ranks), d, g)  # one draw: the keys, then the landmark pool
        keys, pool = both[:, :n], both[:, n:]
        for r in ranks:
            init = LANDMARK_INIT_STD * torch.randn(n_sets, r, d, generator=g, dtype=torch.float64)
            for placement, landmarks in (("init", init), ("sampled", pool[:, :r])):
                for eps in epss:
                    rows.append({"family": family, "landmarks": placement, "rank": r, "eps": eps, "n": n, "d": d,
                                 "t": t, **error_rows(keys, landmarks, t, eps)})
    return rows


def gate_keys(model, x: torch.Tensor) -> list[torch.Tensor]:
    """The keys [B, H_kv, T, d] that each MagnitudeGate of ``model`` reads when it runs on tokens x [B, T], in
    layer order (forward pre-hooks: the model is not changed)."""
    gates = magnitude_gates(model)
    if not gates:
        raise ConfigError("this model has no magnitude gate (train it with a magnitude-* attention variant)")
    keys: list[torch.Tensor] = []
    handles = [gate.register_forward_pre_hook(lambda mod, args: keys.append(args[0].detach())) for gate in gates]
    try:
        with torch.no_grad():
            model(x)
    finally:
        for handle in handles:
            handle.remove()
    return keys


def _landmarks(placement: str, gate, pool: torch.Tensor, n_sets: int, r: int, g: torch.Generator) -> torch.Tensor:
    """[n_sets, H, r, d] float64 landmarks for one gate: ``init`` draws, r keys of ``pool`` [S, H, n, d] (other
    windows at the same gate), or the gate's own trained ones."""
    if placement == "init":
        return LANDMARK_INIT_STD * torch.randn(n_sets, *pool.shape[1:2], r, pool.shape[-1], generator=g,
                                               dtype=torch.float64)
    if placement == "sampled":
        return pool[:n_sets, :, torch.randperm(pool.shape[-2], generator=g)[:r]].double()
    return gate.landmarks.detach().double()[None].expand(n_sets, -1, -1, -1)


def trained_rows(run_dir, ranks=(16, 32, 64, 128), epss=(1e-3, 1e-2, 1e-1), n_sets: int = 4, seed: int = 0,
                 chunk: int = 64) -> list[dict]:
    """Rows like :func:`run` for the keys of a trained run (module docstring): the first ``n_sets`` validation
    windows of block_size tokens; ``sampled`` landmarks from the next windows. Each gate is solved at its learned
    t and at each eps (the run was trained at its own; the others show what a larger eps would buy); the errors of
    all layers and heads are pooled."""
    model, _, cfg = load_run(run_dir)
    data = prepare(cfg.data)
    n = cfg.model.block_size
    x = torch.cat([xb for xb, _ in data.val_batches(2 * n_sets * n, 2 * n_sets, n)])
    if x.shape[0] < 2 * n_sets:
        raise ConfigError(f"{run_dir}'s validation split holds {x.shape[0]} windows of {n} tokens; "
                          f"{2 * n_sets} are needed (use fewer sets)")
    gates, keys = magnitude_gates(model), gate_keys(model, x)
    g = torch.Generator().manual_seed(seed)
    placements = {r: list(LANDMARKS) for r in ranks}
    if getattr(gates[0], "landmarks", None) is not None:
        placements.setdefault(gates[0].landmarks.shape[-2], []).append("trained")
    rows = []
    for r, names in sorted(placements.items()):
        for placement in names:
            landmarks = [_landmarks(placement, gate, k[n_sets:], n_sets, r, g) for gate, k in zip(gates, keys)]
            for eps in epss:
                pooled: dict[str, list] = {}
                for gate, k, marks in zip(gates, keys, landmarks):
                    for key, value in _errors(k[:n_sets], marks, float(gate.t.detach()), eps, chunk).items():
                        pooled.setdefault(key, []).append(value)
                rows.append({"family": f"trained ({Path(run_dir).name})", "landmarks": placement, "rank": r,
                             "eps": eps, "trained_eps": gates[0].eps, "n": n, "d": keys[0].shape[-1],
                             "layers": len(gates), "t": [round(float(gate.t.detach()), 4) for gate in gates],
                             "run": Path(run_dir).name, "solver": gates[0].solver, "form": gates[0].form,
                             **{key: _summary(torch.cat(values)) for key, values in pooled.items()}})
    return rows


def error_table(rows: list[dict]) -> str:
    """Markdown: one line per row of :func:`run`, each statistic as "median / p95 / max" (2 significant digits)."""
    def cell(s):
        return f"{s['median']:.2g} / {s['p95']:.2g} / {s['max']:.2g}"

    lines = ["| keys | landmarks | r | eps | \\|w exact\\| | w error | M error | clamp gate error | linear gate error |",
             "|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        lines.append(f"| {row['family']} | {row['landmarks']} | {row['rank']} | {row['eps']:g} | "
                     + " | ".join(cell(row[k]) for k in ("w_exact", "w", "M", "gate_clamp", "gate_linear")) + " |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, help="write the rows as JSON here (default: print them)")
    parser.add_argument("--n", type=int, default=256)
    parser.add_argument("--sets", type=int, default=4)
    parser.add_argument("--trained", nargs="+", type=Path, metavar="RUN_DIR",
                        help="the keys of these trained magnitude runs instead of the synthetic families")
    args = parser.parse_args(argv)
    if args.trained:
        rows = [row for run_dir in args.trained for row in trained_rows(run_dir, n_sets=args.sets)]
    else:
        rows = run(n=args.n, n_sets=args.sets)
    text = json.dumps(rows, indent=1)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
