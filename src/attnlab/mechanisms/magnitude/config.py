"""The switches of magnitude attention: :class:`MagnitudeConfig`, ``AttentionConfig.magnitude`` (None: off).

Its own rules are checked here, once; the rules that involve the rest of the layer (causal masking, the softmax)
are checked by AttentionConfig. ``FLAT_NAMES`` maps the flat keys of older configs (``magnitude = "causal"``,
``magnitude_t = 2.0``, ``allow_future_leak = true``) to this table's fields: attnlab.configio folds them into
``magnitude`` when a dict, a TOML file or an override is read, so every shipped run still loads.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ...configio import fold_keys
from ...errors import ConfigError, check_choice, check_number, strict_fields
from .names import APPLY, CAUSAL_FORMS, FORMS, GATE_ALIASES, GATES, KERNELS, LOWRANK, SOLVERS

ALL_SOLVERS = (*SOLVERS, LOWRANK)


@strict_fields
@dataclass(frozen=True)
class MagnitudeConfig:
    """Magnitude weights of the keys (the Magnitude Attention write-up), as a gate on the values or a logit prior."""

    form: str = "causal"
    """Which key set each weight is taken in: `"global"`: mu = (Z + eps I)^-1 1 over all keys (bidirectional; in a causal model it leaks the future); `"causal"`: per key, the weight of key j inside its own prefix 1..j (exact, keeps SDPA); `"prefix"`: per (i, j), the weight of key j inside query i's prefix 1..i (exact)."""
    apply: str = "values"
    """Where the weights act: `"values"`: the gate on the values, Attn(Q, K, g o V) (the write-up); `"logits"`: a prior inside the softmax, p_ij ~ max(w, floor)_ij exp(z_ij), i.e. logits z_ij + log max(w_ij, floor), floor = `PRIOR_FLOOR` = 1e-4 (the control for the write-up's argument against shifting scores; no gate, so gate, beta and gamma are unused). Every form; keeps SDPA (a float mask)."""
    t: float = 1.0
    """Initial t in Z_jl = exp(-t ||k_j - k_l||^2 / d_k), learned as log t (so t stays > 0)."""
    eps: float = 1e-3
    """Tikhonov eps in (Z + eps I) mu = 1; eps > 0 bounds the condition number and the gradients on duplicate keys."""
    kernel: str = "gaussian"
    """The similarity of two keys: `"gaussian"` (the write-up) or `"laplacian"`: exp(-t ||k_j - k_l||), the classical metric-space magnitude."""
    solver: str = "cholesky"
    """`"cholesky"` (exact), `"cg"`: conjugate gradient truncated at `cg_iters` (global form only), or `"lowrank"`: Z ~ Phi Phi' + D with Nystrom features against `rank` learned landmarks per K/V head, every prefix solved chunk by chunk in O(T r^2) (causal and prefix forms; Gaussian kernel; eps > 0)."""
    rank: int = 32
    """Landmarks r of `solver="lowrank"` (1 <= r <= block_size)."""
    chunk: int = 64
    """Positions per block of the low-rank solver's chunked solve (the same numbers for any value; a speed knob)."""
    block: int | None = None
    """Queries per block of the prefix form's block-wise attention (low-rank solver; the same numbers for any value, a speed knob); `None`: `chunk` on the CPU and at least 256 on other devices, where every block costs a fixed number of kernel launches."""
    cg_iters: int = 5
    """CG iterations when `solver="cg"` (the write-up: "3-5 iterations")."""
    gate: str = "clamp"
    """`"clamp"`: sigmoid(beta clamp(mu, 0, 1) + gamma); `"sigmoid"`: sigmoid(beta mu + gamma), as the write-up writes it (`"seed"` is an old name for it); `"linear"`: clamp(beta mu + gamma, 0, 1)."""
    beta: float = 1.0
    """Initial beta of the gate (learned)."""
    gamma: float = 0.0
    """Initial gamma of the gate (learned)."""
    allow_future_leak: bool = False
    """Permit `form="global"` in a causal layer: reproduces the write-up as written, and leaks the future."""

    def __post_init__(self):
        check_choice("attention.magnitude.form", self.form, FORMS)
        check_choice("attention.magnitude.apply", self.apply, APPLY)
        check_number("attention.magnitude.t", self.t, low=0.0, low_open=True)
        check_number("attention.magnitude.eps", self.eps, low=0.0)
        check_choice("attention.magnitude.kernel", self.kernel, KERNELS)
        check_choice("attention.magnitude.solver", self.solver, ALL_SOLVERS)
        for name in ("rank", "chunk", "cg_iters"):
            check_number(f"attention.magnitude.{name}", getattr(self, name), low=1, integer=True)
        if self.block is not None:
            check_number("attention.magnitude.block", self.block, low=1, integer=True)
        if self.gate in GATE_ALIASES:  # an earlier name of a gate: the config holds today's
            object.__setattr__(self, "gate", GATE_ALIASES[self.gate])
        check_choice("attention.magnitude.gate", self.gate, GATES)
        check_number("attention.magnitude.beta", self.beta)
        check_number("attention.magnitude.gamma", self.gamma)
        if not isinstance(self.allow_future_leak, bool):
            raise ConfigError(f"attention.magnitude.allow_future_leak={self.allow_future_leak!r} must be true or false")
        if self.form in CAUSAL_FORMS and self.solver == "cg":
            raise ConfigError(f"attention.magnitude.form={self.form!r} needs solver='cholesky' or 'lowrank': the "
                              f"prefix forms come from one Cholesky factor, and CG solves a single system, not every "
                              f"prefix")
        if self.solver == LOWRANK:
            check_lowrank(self.form, self.kernel, self.eps, where="attention.magnitude.")

    def replace(self, **changes) -> "MagnitudeConfig":
        return dataclasses.replace(self, **changes)


def check_lowrank(form: str, kernel: str, eps: float, where: str = "") -> None:
    """What the low-rank solver needs: a causal form, the Gaussian kernel, eps > 0 (one line each; the one home of
    this rule: the config and MagnitudeGate call it)."""
    if form not in CAUSAL_FORMS:
        raise ConfigError(f"{where}solver='lowrank' solves every prefix, so it needs form 'causal' or 'prefix', got "
                          f"{where}form={form!r}")
    if kernel != "gaussian":
        raise ConfigError(f"{where}solver='lowrank' approximates the Gaussian kernel; {where}kernel={kernel!r} needs "
                          f"solver='cholesky'")
    if not eps > 0:
        raise ConfigError(f"{where}eps={eps!r}: solver='lowrank' needs eps > 0 (the diagonal 1 - ||phi_j||^2 is 0 "
                          f"for a key on a landmark)")


FLAT_NAMES = {"magnitude_" + f.name: f.name for f in dataclasses.fields(MagnitudeConfig)
              if f.name not in ("form", "allow_future_leak")} | {"allow_future_leak": "allow_future_leak"}
"""The flat AttentionConfig keys of older configs -> MagnitudeConfig fields (``magnitude`` itself held the form)."""


def fold_flat(data: dict, where: str = "attention") -> dict:
    """``data`` (an AttentionConfig table) with the flat magnitude keys folded into one ``magnitude`` table:
    ``{"magnitude": "causal", "magnitude_t": 2.0}`` -> ``{"magnitude": {"form": "causal", "t": 2.0}}``;
    ``magnitude = "off"`` (the old default) -> no table. A flat key without a form is a one-line error."""
    if data.get("magnitude", "off") in ("off", None):
        flat = [key for key in FLAT_NAMES if key in data]
        if flat:
            raise ConfigError(f"{where}.{flat[0]} sets a magnitude switch, but magnitude is off; set "
                              f"{where}.magnitude to 'global', 'causal' or 'prefix' (or a table)")
        return {k: v for k, v in data.items() if k != "magnitude"}
    return fold_keys(data, "magnitude", FLAT_NAMES, "form")


__all__ = ["ALL_SOLVERS", "FLAT_NAMES", "MagnitudeConfig", "check_lowrank", "fold_flat"]
