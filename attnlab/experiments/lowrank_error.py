"""How far the low-rank magnitude solver is from the exact one (issue 16, item 2).

For key sets of T keys in R^d (families below), r landmarks, and each causal quantity, the distribution over
positions (median, 95th percentile, max) of the absolute error against the exact Cholesky forms of
:mod:`attnlab.functional.magnitude` at the same t and eps:

    w      |w_j - w_j exact|          key j's weight inside its own prefix (the "causal" gate's input)
    M      |M_ij - M_ij exact|, j <= i  key j's weight inside query i's prefix (the "prefix" gate's input)
    gate   |g(w_j) - g(w_j exact)|    for the default clamp gate and the linear gate at beta = 1, gamma = 0

Families: ``iid`` (N(0, 1) coordinates), ``rank-4`` (4 latent N(0, 1) factors through a random 4 x d map / 2,
the notes' ill-conditioned case) and ``clustered`` (16 centres N(0, 1), each key its centre + N(0, 0.3^2) noise);
for the keys of a trained model, call :func:`error_rows` on them. Landmarks: ``init`` (N(0, 0.5^2), what a
model starts from) and ``sampled`` (r more keys drawn with the key set, from the same centres or subspace but not
among the keys compared: landmarks placed where keys are, as training can move them).

    python -m attnlab.experiments.lowrank_error --out results/magnitude-lowrank/error.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from ..functional import magnitude as M
from ..functional.magnitude_lowrank import LANDMARK_INIT_STD, lowrank_prefix, nystrom_features
from ..functional.magnitude_lowrank import prefix_weight_matrix_lowrank

__all__ = ["FAMILIES", "LANDMARKS", "error_rows", "error_table", "keys_of", "main", "run"]

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


def error_rows(keys: torch.Tensor, landmarks: torch.Tensor, t: float = 1.0, eps: float = 1e-3, chunk: int = 64) -> dict:
    """{"w", "M", "gate_clamp", "gate_linear"}: each {"median", "p95", "max"} of the absolute error of the low-rank
    weights of ``keys`` [..., T, d] with ``landmarks`` [..., r, d] against the exact prefix forms, in float64; and
    "w_exact", the same statistics of |w exact| (the scale the errors compare with)."""
    L, y, _ = M.prefix_factor(M.similarity(keys, t), eps)
    w_exact, m_exact = M.own_prefix_weights_from_factor(L, y), M.prefix_weight_matrix_from_factor(L, y)
    phi, d = nystrom_features(keys, landmarks, t)
    w, _, c = lowrank_prefix(phi, d + eps, chunk)
    m = prefix_weight_matrix_lowrank(phi, d + eps, c)
    lower = torch.ones(keys.shape[-2], keys.shape[-2], dtype=torch.bool).tril()
    out = {"w_exact": _summary(w_exact.abs()), "w": _summary((w - w_exact).abs()),
           "M": _summary((m - m_exact).abs()[..., lower])}
    for gate in GATES:
        out[f"gate_{gate}"] = _summary((M.gate(w, 1.0, 0.0, gate) - M.gate(w_exact, 1.0, 0.0, gate)).abs())
    return out


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
    args = parser.parse_args(argv)
    text = json.dumps(run(n=args.n, n_sets=args.sets), indent=1)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
