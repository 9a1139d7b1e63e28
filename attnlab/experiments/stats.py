"""Small-sample statistics for comparing attention variants across seeds.

* :func:`describe` — n, mean and sample standard deviation (ddof=1) of one variant's final losses.
* :func:`welch_ttest` — Welch's unequal-variance t-test of two samples: the statistic
  ``t = (mean_a - mean_b) / sqrt(s_a^2/n_a + s_b^2/n_b)`` (Welch 1947), the Welch–Satterthwaite degrees of
  freedom ``df = (s_a^2/n_a + s_b^2/n_b)^2 / ((s_a^2/n_a)^2/(n_a-1) + (s_b^2/n_b)^2/(n_b-1))``
  (Satterthwaite 1946; Welch 1947) and the two-sided p-value ``2 * P(T_df > |t|)``, computed by
  :func:`scipy.stats.ttest_ind` with ``equal_var=False``.

References: B. L. Welch, "The generalization of 'Student's' problem when several different population
variances are involved", Biometrika 34 (1947) 28-35. F. E. Satterthwaite, "An approximate distribution of
estimates of variance components", Biometrics Bulletin 2 (1946) 110-114.

Quantities that are undefined for the data at hand (a standard deviation from one seed, a test with fewer
than two seeds on a side, a test between two samples without any spread) are ``None`` with a ``reason``,
never NaN, so reports can print "n/a" and JSON stays valid.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import asdict, dataclass

__all__ = ["Summary", "WelchResult", "describe", "welch_ttest"]


@dataclass(frozen=True)
class Summary:
    """n, mean and sample standard deviation (ddof=1; None when n < 2) of a sample; mean is None when n == 0."""

    n: int
    mean: float | None
    std: float | None

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class WelchResult:
    """Welch's t-test of sample a against sample b: ``t`` > 0 means a's mean is larger.

    ``t``, ``df`` and ``p`` are None when the test is undefined; ``reason`` then says why.
    """

    t: float | None
    df: float | None
    p: float | None
    reason: str | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def _finite_floats(values: Sequence[float], what: str) -> list[float]:
    """``values`` as floats; NaN or infinite entries are a ValueError (a diverged run is not a loss)."""
    out = [float(v) for v in values]
    bad = [v for v in out if not math.isfinite(v)]
    if bad:
        raise ValueError(f"{what} contains non-finite values {bad}; leave diverged runs out of the sample")
    return out


def describe(values: Sequence[float]) -> Summary:
    """n, mean and sample standard deviation (ddof=1) of ``values``; std is None for fewer than two values."""
    xs = _finite_floats(values, "sample")
    n = len(xs)
    if n == 0:
        return Summary(0, None, None)
    mean = math.fsum(xs) / n
    if n < 2:
        return Summary(n, mean, None)
    var = math.fsum((x - mean) ** 2 for x in xs) / (n - 1)
    return Summary(n, mean, math.sqrt(var))


def welch_ttest(a: Sequence[float], b: Sequence[float]) -> WelchResult:
    """Welch's two-sided t-test of ``a`` against ``b`` (Welch 1947; df after Satterthwaite 1946).

    Undefined cases give None fields and a ``reason``: fewer than two values in either sample (no variance
    estimate), or zero variance in both samples (the standard error is 0, so t is 0/0 or ±inf and the
    t distribution has no degrees of freedom).
    """
    from scipy import stats

    xa, xb = _finite_floats(a, "sample a"), _finite_floats(b, "sample b")
    if len(xa) < 2 or len(xb) < 2:
        return WelchResult(None, None, None, f"needs >= 2 values per sample (got {len(xa)} and {len(xb)})")
    sa, sb = describe(xa).std, describe(xb).std
    if sa == 0 and sb == 0:
        return WelchResult(None, None, None, "zero variance in both samples")
    with warnings.catch_warnings():  # near-identical values: scipy warns about precision, the result is fine
        warnings.simplefilter("ignore", RuntimeWarning)
        res = stats.ttest_ind(xa, xb, equal_var=False)
    return WelchResult(float(res.statistic), float(res.df), float(res.pvalue))


def mean_std_text(d: dict | None, fmt: str) -> str:
    """``"mean ± std"`` of a :meth:`Summary.to_dict` in ``fmt`` ("n/a" without a mean; the mean alone without a std)."""
    if not d or d.get("mean") is None:
        return "n/a"
    return format(d["mean"], fmt) + ("" if d.get("std") is None else f" ± {format(d['std'], fmt)}")


def curve_summary(curves: list[dict]) -> dict[int, Summary]:
    """{step: n/mean/std of the value} at the steps every curve evaluated; a curve is {step: value} or, for the
    loss, {step: (tokens, loss)}."""
    if not curves:
        return {}
    steps = sorted(set.intersection(*(set(c) for c in curves)))
    value = lambda v: v[1] if isinstance(v, tuple) else v
    return {s: describe([value(c[s]) for c in curves]) for s in steps}
