"""The magnitude gate of the Magnitude Attention write-up as a module: it holds t, beta, gamma; the math is
attnlab.mechanisms.magnitude.reference.

With apply_to="logits" the same module returns a logit prior instead of a gate (and holds t only)."""

from __future__ import annotations

import math

import torch
from torch import nn

from . import reference as M
from .fused import full_precision_backward, gaussian_key_weights, lowrank_key_weights
from .fused import lowrank_prefix_factors
from .config import MagnitudeConfig
from .lowrank import LANDMARK_INIT_STD


class MagnitudeGate(nn.Module):
    """Keys k [B, H, S, d] -> value gates: [B, H, S] (forms "global", "causal") or [B, H, S, S] ("prefix").

        Z = exp(-t ||k_j - k_l||^2 / d)          t = exp(log_t): learnable and always > 0
        "global": g_j  = gate(mu_j),  (Z + eps I) mu = 1 over all keys          (the Magnitude Attention write-up as written)
        "causal": g_j  = gate(y_j / L_jj)        key j's weight inside its own prefix {1..j}   (exact, causal)
        "prefix": g_ij = gate(M_ij)              key j's weight inside query i's prefix {1..i}  (exact, causal)
        gate(w)  = sigmoid(beta clamp(w, 0, 1) + gamma) | sigmoid(beta w + gamma) | clamp(beta w + gamma, 0, 1)
    solver="lowrank" (causal and prefix forms): Z ~ Phi Phi' + D with Nystrom features against ``rank`` landmarks
    per K/V head (parameters [n_heads, rank, head_dim], N(0, 0.5^2) at init), every prefix solved chunk by chunk
    (:mod:`attnlab.mechanisms.magnitude.lowrank`).
    apply_to="logits" (the control for the write-up's argument against shifting scores): the output is the logit prior
    log max(w, PRIOR_FLOOR) of the same shape instead of gate(w), for softmax(z + prior); there is no gate, so the
    module has no beta and no gamma (the attributes are None) and the gate settings are not used.

    After each forward, ``last_stats`` holds floats a trainer can log per layer: t, magnitude_over_n (|X|/N of the
    whole key set, mean over batch and heads), residual (largest relative residual of the solve; CG's truncation
    error), mu_min / mu_max (over the weights the gate reads), jitter (largest Cholesky jitter; 0 normally),
    gate_mean (apply_to="logits": prior_floored, the fraction of the weights read that sit at the floor instead).
    Set ``record_stats = False`` to skip them (each costs a device sync, and the residual one more product
    with Z); the trainer does so on the steps it does not log (:func:`record_magnitude_stats`, :func:`magnitude_log`).
    """

    def __init__(self, form: str | MagnitudeConfig = "causal", *, apply_to: str = "values", record_stats: bool = True,
                 n_heads: int = 1, head_dim: int | None = None, **settings):
        """form: a MagnitudeConfig, or its form with the other fields as settings (t, eps, kernel, solver, rank,
        chunk, cg_iters, gate, beta, gamma; apply_to is its ``apply``), checked there once. n_heads, head_dim: the
        K/V heads and their width (the low-rank solver keeps one set of landmarks per K/V head)."""
        super().__init__()
        try:
            cfg = form if isinstance(form, MagnitudeConfig) else MagnitudeConfig(form=form, apply=apply_to, **settings)
        except TypeError as e:  # an unknown setting: name the allowed ones
            raise ValueError(f"MagnitudeGate: {e}; settings are MagnitudeConfig's fields") from None
        if cfg.solver == "lowrank" and head_dim is None:
            raise ValueError("MagnitudeGate with solver='lowrank' needs head_dim (the landmarks' width)")
        self.config = cfg
        self.form, self.eps, self.kernel, self.solver = cfg.form, float(cfg.eps), cfg.kernel, cfg.solver
        self.cg_iters, self.gate_form, self.apply_to, self.record_stats = cfg.cg_iters, cfg.gate, cfg.apply, record_stats
        self.log_t = nn.Parameter(torch.tensor(math.log(cfg.t)))  # t = exp(log t) > 0
        if cfg.apply == "values":
            self.beta = nn.Parameter(torch.tensor(float(cfg.beta)))
            self.gamma = nn.Parameter(torch.tensor(float(cfg.gamma)))
        else:  # a logit prior has no gate: no parameters that would never receive a gradient
            self.register_parameter("beta", None)
            self.register_parameter("gamma", None)
        self.chunk = cfg.chunk
        if cfg.solver == "lowrank":  # one set of landmarks per K/V head
            self.landmarks = nn.Parameter(torch.randn(n_heads, cfg.rank, head_dim) * LANDMARK_INIT_STD)
        else:
            self.register_parameter("landmarks", None)
        self.last_stats: dict[str, float] = {}

    @property
    def t(self) -> torch.Tensor:
        return self.log_t.exp()

    def weights(self, k: torch.Tensor, with_residual: bool = True):
        """(w, |X| [...], SolveInfo): mu_j, w_j or M_ij of keys k [..., S, d] (computed in >= float32).

        The Gaussian kernel takes the fused fast path (gaussian_key_weights: same math, hand-written gradients);
        the Laplacian kernel and the low-rank solver the general functions. with_residual=False leaves
        SolveInfo.residual empty. On CUDA the matmuls run in IEEE float32 whatever the caller's TF32 setting, in
        the forward and in the backward (the fused kernel guards itself; the autograd paths go through
        full_precision_backward).
        """
        if k.dtype in (torch.float16, torch.bfloat16):
            k = k.float()  # no half-precision Cholesky; at eps = 1e-3 float32 moves gates by < 1e-3 (measure_gates)
        if self.kernel == "gaussian" and self.solver != "lowrank":  # guards its own forward and backward
            return gaussian_key_weights(k, self.t.to(k.dtype), self.eps, form=self.form, solver=self.solver,
                                        max_iter=self.cg_iters, with_residual=with_residual)
        params = (self.log_t,) if self.landmarks is None else (self.log_t, self.landmarks)
        info = []

        def solve(keys, log_t, landmarks=None):
            w, mag, solve_info = self._solve(keys, log_t.exp().to(keys.dtype), landmarks, with_residual)
            info.append(solve_info)
            return w, mag

        w, mag = full_precision_backward(solve, k, *params)
        return w, mag, info[0]

    def _solve(self, k, t, landmarks, with_residual):
        """weights() on the general paths (autograd through torch's solves), t = exp(log t) given."""
        if self.solver == "lowrank":
            return lowrank_key_weights(k, landmarks.to(k.dtype), t, self.eps, form=self.form, chunk=self.chunk,
                                       with_residual=with_residual)
        z = M.similarity(k, t, self.kernel)
        if self.form == "global":
            mu, info = M.solve_weights(z, self.eps, solver=self.solver, max_iter=self.cg_iters)
            return mu, mu.sum(-1), info
        L, y, jitter = M.prefix_factor(z, self.eps)
        w = M.own_prefix_weights_from_factor(L, y) if self.form == "causal" else M.prefix_weight_matrix_from_factor(L, y)
        with torch.no_grad():  # residual of the full system, for the log: mu = L'^-1 y
            mu = torch.linalg.solve_triangular(L.mT, y.unsqueeze(-1), upper=True).squeeze(-1)
            residual = M.relative_residual(M.tikhonov(z, self.eps) + torch.diag_embed(jitter), mu)
        return w, (y * y).sum(-1), M.SolveInfo(residual, 0, jitter)

    def prefix_factors(self, k: torch.Tensor):
        """(phi, lambda, c) of keys k [B, H, S, d] (form "prefix", solver "lowrank"): M_ij = (1 - phi_j'c_i) /
        lambda_j, the weights that forward() would return as an [S, S] matrix, as factors for
        attnlab.mechanisms.magnitude.prefix_blocks (>= float32; IEEE float32 matmuls on CUDA). The stats, when recorded,
        come from the [S, S] weights computed once more without gradients."""
        if self.form != "prefix" or self.solver != "lowrank":
            raise ValueError(f"prefix_factors needs form 'prefix' and solver 'lowrank', got {self.form!r}, "
                             f"{self.solver!r}")
        if k.dtype in (torch.float16, torch.bfloat16):
            k = k.float()

        def solve(keys, log_t, landmarks):
            return lowrank_prefix_factors(keys, landmarks.to(keys.dtype), log_t.exp().to(keys.dtype), self.eps,
                                          chunk=self.chunk)

        with torch.autocast(k.device.type, enabled=False):
            phi, lam, c = full_precision_backward(solve, k, self.log_t, self.landmarks)
            if self.record_stats:
                with torch.no_grad():
                    w, mag, info = self.weights(k.detach())
                    self._record(w, mag, info, self._output(w), k.shape[-2])
        return phi, lam, c

    def forward(self, k: torch.Tensor) -> torch.Tensor:
        # no bfloat16 solves under mixed precision; weights() keeps TF32 out of the solves
        with torch.autocast(k.device.type, enabled=False):
            w, mag, info = self.weights(k, with_residual=self.record_stats)
            g = self._output(w)
        if self.record_stats:
            self._record(w, mag, info, g, k.shape[-2])
        return g

    def _output(self, w: torch.Tensor) -> torch.Tensor:
        """gate(w), or with apply_to="logits" log max(w, PRIOR_FLOOR): added to the logits, p_ij ~ w_ij exp(z_ij)."""
        if self.apply_to == "logits":
            return M.log_prior(w)
        return M.gate(w, self.beta.to(w.dtype), self.gamma.to(w.dtype), self.gate_form)

    @torch.compiler.disable  # device syncs for the log: kept out of a compiled graph
    @torch.no_grad()
    def _record(self, w, mag, info, g, n) -> None:
        if self.form == "prefix":  # the weights the gate reads: the lower triangle j <= i
            keep = torch.ones(n, n, dtype=torch.bool, device=w.device).tril()
            w, g = w[..., keep], g[..., keep]
        self.last_stats = {
            "t": float(self.t), "magnitude_over_n": float(mag.mean()) / n, "residual": float(info.residual.max()),
            "mu_min": float(w.min()), "mu_max": float(w.max()), "jitter": float(info.jitter.max()),
        }
        if self.apply_to == "logits":
            self.last_stats["prior_floored"] = float((w <= M.PRIOR_FLOOR).float().mean())
        else:
            self.last_stats["gate_mean"] = float(g.mean())


def magnitude_stats(model: nn.Module) -> dict[str, float]:
    """{"<module name>.<stat>": value} over every MagnitudeGate in model (its last forward): one dict to log."""
    return {f"{name}.{key}": value for name, mod in model.named_modules() if isinstance(mod, MagnitudeGate)
            for key, value in mod.last_stats.items()}


def magnitude_gates(model: nn.Module) -> list[MagnitudeGate]:
    """The MagnitudeGates of model in module order (one per attention layer: entry i belongs to layer i)."""
    return [mod for mod in model.modules() if isinstance(mod, MagnitudeGate)]


def record_magnitude_stats(model: nn.Module, on: bool) -> None:
    """Turn recording of ``last_stats`` on or off for every gate (off: no device syncs, no residual product)."""
    for gate in magnitude_gates(model):
        gate.record_stats = on


def magnitude_log(model: nn.Module, prefix: str = "mag") -> dict[str, float]:
    """{"<prefix>/L<i>/<stat>": value}: the last recorded stats of the i-th gate (layer i), flat, for a log row."""
    return {f"{prefix}/L{i}/{key}": value for i, gate in enumerate(magnitude_gates(model))
            for key, value in gate.last_stats.items()}
