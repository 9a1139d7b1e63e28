"""The magnitude write-up's numbers, recomputed by attnlab: hijacking, the collapse of a cluster, the effective number of points.

:func:`run_demo` returns them as a dict (and :func:`main` prints them); :func:`measure_gates` is the measurement
behind the default gate (``magnitude_gate="clamp"``, ``magnitude_eps=1e-3``). Every number is computed by the
library (attention weights by :func:`attnlab.functional.attention`, weights by the magnitude solvers); the closed
forms beside them are the write-up's arithmetic and the closed forms of docs/magnitude.md ("Closed forms").
"""

from __future__ import annotations

import math
import warnings

import torch

from ..functional import attention
from ..mechanisms.magnitude import reference as M

CLUSTER, UNIQUE_SCORE = 50, 20.0  # the magnitude write-up: 50 keys with exp score 1 against one key with exp score 20


def _hijack_keys(eps: float, m: int = CLUSTER, unique_score: float = UNIQUE_SCORE):
    """Query e1; keys: m clones at 10 e2 (q.k = 0, exp score 1), then the unique key ln(s) e1 (exp score s)."""
    d = 4
    q = torch.zeros(1, 1, 1, d, dtype=torch.float64)
    q[..., 0] = 1.0
    k = torch.zeros(1, 1, m + 1, d, dtype=torch.float64)
    k[..., :m, 1] = 10.0  # far from the unique key: Z between them = exp(-t * (100 + ln(20)^2) / d) ~ 1e-11
    k[..., m, 0] = math.log(unique_score)
    return q, k


def hijacking(eps: float = 1e-3, t: float = 1.0) -> dict:
    """Softmax weights of the unique key and of the cluster, and the value mass each keeps under every gate.

    value mass of a set S = sum_{j in S} p_j g_j: what the set contributes to o = sum_j p_j g_j v_j per unit v.
    """
    q, k = _hijack_keys(eps)
    v = torch.eye(k.shape[-2], dtype=torch.float64)[None, None]
    _, p = attention(q, k, v, scale=1.0, return_weights=True)  # p_j = exp(q.k_j) / sum exp(q.k_l)
    p = p[0, 0, 0]
    out = {"softmax": {"unique": float(p[-1]), "cluster": float(p[:-1].sum())},
           "writeup_arithmetic": {"unique": UNIQUE_SCORE / (UNIQUE_SCORE + CLUSTER),
                               "cluster": CLUSTER / (UNIQUE_SCORE + CLUSTER)}}
    z = M.similarity(k[0, 0], t)
    weights = {"global": M.solve_weights(z, eps)[0]}
    L, y, _ = M.prefix_factor(z, eps)
    weights["causal"] = M.own_prefix_weights_from_factor(L, y)  # each key inside its own prefix
    weights["prefix"] = M.prefix_weight_matrix_from_factor(L, y)[-1]  # inside the last query's prefix
    out["weights"] = {form: {"unique": float(w[-1]), "cluster_sum": float(w[:-1].sum())} for form, w in weights.items()}
    out["value_mass"] = {}
    for form, w in weights.items():
        for gate in M.GATES:
            g = M.gate(w, 1.0, 0.0, gate)
            out["value_mass"][f"{form}/{gate}"] = {"unique": float(p[-1] * g[-1]),
                                                   "cluster": float((p[:-1] * g[:-1]).sum())}
    return out


HIJACK_MS = (0, 4, 16, 64)  # the cluster sizes of the hijack task's sweep (attnlab.tasks.hijack.SWEEP_M)


def hijack_share_against_m(ms=HIJACK_MS, unique_score: float = UNIQUE_SCORE, eps: float = 1e-3) -> dict:
    """The magnitude write-up's hijacking as the cluster grows, for the mechanism alone (no training): m clones with exp score 1
    (at 10 e2, q.k = 0), then the unique key with exp score ``unique_score`` (ln(score) e1), read by the query e1.

    Returns {m: {form: share}}, the unique key's share of what the query reads:

    - ``softmax``: p_u = s / (s + m);
    - ``values/<causal|prefix>/<gate>``: the magnitude gate on the values (beta = 1, gamma = 0, the initial
      parameters), share = p_u g_u / sum_j p_j g_j of the output o = sum_j p_j g_j v_j;
    - ``logits/<causal|prefix>``: the weights as a logit prior, share = w_u e^{z_u} / sum_j w_j e^{z_j}
      (weights below PRIOR_FLOOR floored, as the layer does).

    The causal form weighs each key inside its own prefix (the r-th clone 1/(r + eps): the cluster counts as a
    harmonic number H_m of keys); the prefix form weighs the keys inside the query's prefix (each clone
    1/(m + eps): the cluster counts as one key).
    """
    out = {}
    for m in ms:
        q, k = _hijack_keys(eps, m, unique_score)
        z = torch.einsum("d,nd->n", q[0, 0, 0], k[0, 0])
        p = torch.softmax(z, dim=0)
        row = {"softmax": float(p[-1])}
        sim = M.similarity(k[0, 0], 1.0)
        L, y, _ = M.prefix_factor(sim, eps)
        weights = {"causal": M.own_prefix_weights_from_factor(L, y),  # each key inside its own prefix
                   "prefix": M.prefix_weight_matrix_from_factor(L, y)[-1]}  # inside the query's prefix
        for form, w in weights.items():
            for gate in M.GATES:
                mass = p * M.gate(w, 1.0, 0.0, gate)
                row[f"values/{form}/{gate}"] = float(mass[-1] / mass.sum())
            prior = torch.softmax(z + M.log_prior(w), dim=0)
            row[f"logits/{form}"] = float(prior[-1])
        out[m] = row
    return out


def cluster_collapse(n: int = CLUSTER, eps: float = 1e-3) -> dict:
    """n identical keys: mu_j = 1/(n + eps), |X| = n/(n + eps) -> 1 (notes); per-key causal weights 1/(j + eps)."""
    x = torch.zeros(n, 8, dtype=torch.float64)
    mu = M.magnitude_weights(x, 1.0, eps=eps)
    w = M.prefix_weights(x, 1.0, eps=eps)
    return {"n": n, "eps": eps, "mu_each": float(mu.mean()), "mu_spread": float(mu.max() - mu.min()),
            "magnitude": float(M.magnitude(x, 1.0, eps=eps)), "closed_form": n / (n + eps),
            "linear_gate_cluster_units": float(mu.clamp(0, 1).sum()),
            "causal_form_cluster_units": float(w.clamp(0, 1).sum()),
            "harmonic_number": sum(1.0 / (j + eps) for j in range(1, n + 1))}


def effective_number(n: int = 3, ts=(0.01, 0.1, 0.5, 1.0, 2.0, 5.0, 20.0)) -> dict:
    """|X| of n clones (1), of n far-apart points (n), and of an equilateral set in between, against
    N / (1 + (N - 1) q), q = exp(-t r^2 / d) the common similarity (notes, closed forms)."""
    clones = torch.zeros(n, n, dtype=torch.float64)
    simplex = torch.eye(n, dtype=torch.float64)  # pairwise squared distance r^2 = 2, dimension d = n
    far = 100.0 * simplex
    between = []
    for t in ts:
        q = math.exp(-t * 2.0 / n)
        between.append({"t": t, "q": q, "magnitude": float(M.magnitude(simplex, t)), "closed_form": n / (1 + (n - 1) * q)})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # clones without eps: Z = J is singular, the jitter retry warns
        clone_mag = float(M.magnitude(clones, 1.0))
    return {"n": n, "clones": clone_mag, "clones_eps_1e-3": float(M.magnitude(clones, 1.0, eps=1e-3)),
            "far_apart": float(M.magnitude(far, 1.0)), "between": between}


def run_demo(eps: float = 1e-3) -> dict:
    """All of the magnitude write-up's numbers as a dict: hijacking, cluster_collapse, effective_number, hijack_against_m."""
    return {"hijacking": hijacking(eps), "cluster_collapse": cluster_collapse(eps=eps),
            "effective_number": effective_number(), "hijack_against_m": hijack_share_against_m(eps=eps)}


def _families(n: int, d: int) -> dict:
    g = torch.Generator().manual_seed(1)
    iid = torch.randn(n, d, generator=g, dtype=torch.float64)
    rank4 = torch.randn(n, 4, generator=g, dtype=torch.float64) @ torch.randn(4, d, generator=g, dtype=torch.float64) / 2
    m = min(CLUSTER, n // 2)
    clones, near = iid.clone(), iid.clone()
    clones[:m] = iid[0]
    near[:m] = iid[0] + 1e-6 * torch.randn(m, d, generator=g, dtype=torch.float64)
    return {"iid t=0.1": (iid, 0.1), "iid t=1": (iid, 1.0), "rank-4 t=1": (rank4, 1.0),
            f"{m} clones t=1": (clones, 1.0), f"{m} near-clones (1e-6) t=1": (near, 1.0)}


def measure_gates(n: int = 256, d: int = 64, epss=(0.0, 1e-3), configs=(("float64", "cholesky"), ("float32", "cholesky"),
                  ("float32", "cg"))) -> list[dict]:
    """For each key family, eps, dtype and solver (CG: 5 iterations) and each gate at beta = 1, gamma = 0: whether the
    gate and d(sum_j g_j r_j)/dx are finite, max |dL/dx|, the fraction of saturated gates (g < 1e-3 or > 1 - 1e-3),
    the largest gate error against float64 Cholesky at the same eps, and the bias of sum(mu) against eps = 0."""
    rows = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # eps = 0 on clones: the jitter retry warns, as it should
        for name, (x64, t) in _families(n, d).items():
            rows += _measure_family(name, x64, t, epss, configs)
    return rows


def _measure_family(name, x64, t, epss, configs) -> list[dict]:
    """The rows of :func:`measure_gates` for one key set x64 [N, d] at scale t."""
    rows, n = [], x64.shape[0]
    exact = {eps: M.solve_weights(M.similarity(x64, t), eps)[0] for eps in epss}  # float64 Cholesky
    for eps in epss:
        for dtype, solver in configs:
            row = {"keys": name, "eps": eps, "dtype": dtype, "solver": solver if solver == "cholesky" else "cg5"}
            for form in M.GATES:
                x = x64.to(getattr(torch, dtype)).clone().requires_grad_()
                mu, _ = M.solve_weights(M.similarity(x, t), eps, solver=solver, max_iter=5)
                g = M.gate(mu, 1.0, 0.0, form)
                r = torch.randn(n, generator=torch.Generator().manual_seed(2), dtype=torch.float64).to(g.dtype)
                (g * r).sum().backward()  # L = sum_j g_j r_j, r a fixed random cotangent
                row[form] = {
                    "finite": bool(torch.isfinite(g).all()) and bool(torch.isfinite(x.grad).all()),
                    "max_grad": float(x.grad.abs().max()),
                    "saturated": float(((g < 1e-3) | (g > 1 - 1e-3)).double().mean()),
                    "gate_error": float((g.detach().double() - M.gate(exact[eps], 1.0, 0.0, form)).abs().max()),
                }
            row["sum_mu_bias"] = float(mu.detach().double().sum() / exact[0.0].sum() - 1.0)
            rows.append(row)
    return rows


def print_gate_measurement(rows: list[dict]) -> None:
    for r in rows:
        cells = " | ".join(f"{f}: finite={int(r[f]['finite'])} max|grad|={r[f]['max_grad']:.1e} "
                           f"saturated={r[f]['saturated']:.2f} error={r[f]['gate_error']:.1e}" for f in M.GATES)
        print(f"{r['keys']:27s} eps={r['eps']:<6g} {r['dtype']} {r['solver']:8s} "
              f"sum(mu) bias {r['sum_mu_bias']:+.3f} | {cells}")


def _print(result: dict) -> None:
    h = result["hijacking"]
    print("Hijacking (the magnitude write-up): one key with exp score 20 against 50 keys with exp score 1")
    print(f"  softmax weight  unique {h['softmax']['unique']:.4f}  cluster {h['softmax']['cluster']:.4f}"
          f"   (write-up: 20/70 = {h['writeup_arithmetic']['unique']:.4f}, 50/70 = {h['writeup_arithmetic']['cluster']:.4f})")
    for form, w in h["weights"].items():
        print(f"  magnitude weights ({form:6s}): unique {w['unique']:.4f}, cluster sum {w['cluster_sum']:.4f}")
    print("  value mass sum_j p_j g_j (beta=1, gamma=0):")
    for key, m in h["value_mass"].items():
        print(f"    {key:15s} unique {m['unique']:.4f}  cluster {m['cluster']:.4f}")
    c = result["cluster_collapse"]
    print(f"Cluster of {c['n']} identical keys (eps={c['eps']:g}): mu_j = {c['mu_each']:.6f} each, |X| = "
          f"{c['magnitude']:.6f} (closed form n/(n+eps) = {c['closed_form']:.6f}); linear gate: cluster = "
          f"{c['linear_gate_cluster_units']:.4f} unit; causal per-key form: {c['causal_form_cluster_units']:.4f} "
          f"(harmonic number {c['harmonic_number']:.4f})")
    rows = result["hijack_against_m"]
    print("Hijacking against the cluster size m: the unique key's share of the readout (exp score 20 against 1 per "
          "clone; gates at beta=1, gamma=0)")
    print(f"    {'form':22s}" + "".join(f"{'m = ' + str(m):>10s}" for m in rows))
    for form in next(iter(rows.values())):
        print(f"    {form:22s}" + "".join(f"{row[form]:>10.4f}" for row in rows.values()))
    e = result["effective_number"]
    print(f"Effective number of {e['n']} points: clones {e['clones']:.4f}, far apart {e['far_apart']:.4f}; in between:")
    for b in e["between"]:
        print(f"    t={b['t']:<5g} q={b['q']:.4f}  |X| = {b['magnitude']:.4f}  (N/(1+(N-1)q) = {b['closed_form']:.4f})")


def main() -> dict:
    result = run_demo()
    _print(result)
    return result


if __name__ == "__main__":
    main()
