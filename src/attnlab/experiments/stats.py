"""Small-sample statistics for comparing attention variants across seeds.

* :func:`describe` — n, mean and sample standard deviation (ddof=1) of one variant's final losses.
* :func:`welch_ttest` — Welch's unequal-variance t-test of two samples: the statistic
  ``t = (mean_a - mean_b) / sqrt(s_a^2/n_a + s_b^2/n_b)`` (Welch 1947), the Welch–Satterthwaite degrees of
  freedom ``df = (s_a^2/n_a + s_b^2/n_b)^2 / ((s_a^2/n_a)^2/(n_a-1) + (s_b^2/n_b)^2/(n_b-1))``
  (Satterthwaite 1946; Welch 1947) and the two-sided p-value ``2 * P(T_df > |t|)``, computed by
  :func:`scipy.stats.ttest_ind` with ``equal_var=False``.
* :func:`paired_ttest` — Student's paired t-test (Student 1908), for two variants run on the same seeds (seed i
  of both variants shares the data order, so a[i] and b[i] are a pair): with the differences ``d_i = a_i - b_i``,
  ``t = mean(d) / (s_d / sqrt(n))``, ``s_d`` the sample standard deviation (ddof=1) of d, ``df = n - 1`` and the
  two-sided p-value ``2 * P(T_df > |t|)``, computed by :func:`scipy.stats.ttest_rel`.
* :func:`bootstrap_ci` — a bootstrap confidence interval for ``mean(a) - mean(b)`` by
  :func:`scipy.stats.bootstrap`: paired, the mean of the resampled differences ``d_i``; unpaired, the two
  samples resampled independently and the statistic ``mean(a*) - mean(b*)``. The interval is the
  bias-corrected and accelerated (BCa) one (Efron 1987): with ``B`` resamples ``theta*_b`` and the estimate
  ``theta``, the bias correction ``z0 = Phi^-1(#{theta*_b < theta} / B)``, the acceleration from the jackknife
  values ``theta_(i)`` with mean ``theta_(.)``,
  ``a = sum (theta_(.) - theta_(i))^3 / (6 * (sum (theta_(.) - theta_(i))^2)^(3/2))``, and the endpoints are the
  ``alpha_1``, ``alpha_2`` quantiles of the ``theta*_b`` with
  ``alpha_j = Phi(z0 + (z0 + z_j) / (1 - a (z0 + z_j)))``, ``z_1 = Phi^-1((1 - confidence)/2)``,
  ``z_2 = Phi^-1((1 + confidence)/2)``. Where BCa is undefined (NaN, e.g. ``z0`` infinite for near-degenerate
  data) the percentile interval (the plain ``(1 - confidence)/2`` and ``(1 + confidence)/2`` quantiles of the
  ``theta*_b``; Efron and Tibshirani 1993, ch. 13) is given instead and ``method`` says so. Caveat: with 5-10
  seeds a bootstrap interval undercovers, because resampling a handful of values understates their spread (in a
  simulation with normal data the nominal 95% BCa interval covered about 83% with 5 pairs, 91% with 10 and 94%
  with 20; unpaired, about 90% with 5 per side); the t-tests are exact for normal data and are the primary
  test, the interval a robustness check.
* :func:`holm` — Holm's step-down adjustment for m comparisons (Holm 1979): with the p-values sorted,
  ``p_(1) <= ... <= p_(m)``, the adjusted ``p~_(k) = min(1, max_{j <= k} (m - j + 1) * p_(j))``; rejecting
  where ``p~ <= alpha`` controls the family-wise error rate at ``alpha`` under any dependence between the tests.
* :func:`min_detectable_difference` — the smallest true difference of means ``delta`` that a two-sided t-test at
  level ``alpha`` detects with probability ``power``, from the noncentral t distribution (exact for normal data):
  with ``c = t_{df}^-1(1 - alpha/2)`` and the noncentrality ``lambda``,
  ``power = P(T'_{df,lambda} > c) + P(T'_{df,lambda} < -c)``, solved for ``lambda``; paired
  ``lambda = delta * sqrt(n) / s_d``, ``df = n - 1``; unpaired (pooled sd ``s``)
  ``lambda = delta / (s * sqrt(1/n_a + 1/n_b))``, ``df = n_a + n_b - 2`` (Cohen 1988, ch. 2).
* :func:`threshold_summary` — steps to reach a threshold (e.g. a validation loss) when some runs stop at their
  step cap without reaching it (right-censored there). The Kaplan–Meier estimate (Kaplan and Meier 1958) of the
  probability of not yet having reached it, ``S(t) = prod_{t_j <= t} (1 - d_j / n_j)``, ``d_j`` runs reaching it
  at step ``t_j`` and ``n_j`` runs still at risk at ``t_j`` (a run censored at ``t_j`` is still at risk there),
  by :func:`scipy.stats.ecdf`; the median is the smallest step with ``S(t) <= 1/2`` and is undefined where
  ``S`` stays above 1/2 up to the last step observed (it then exceeds that step).
* :func:`logrank` — the log-rank test of equal steps-to-threshold distributions (Mantel 1966), by
  :func:`scipy.stats.logrank`: summed over the distinct steps ``t_j`` where some run reached the threshold,
  ``O_a = sum d_aj`` observed and ``E_a = sum n_aj d_j / n_j`` expected events in a,
  ``V = sum n_aj n_bj d_j (n_j - d_j) / (n_j^2 (n_j - 1))``; ``z = (O_a - E_a) / sqrt(V)`` and the two-sided
  p-value ``P(chi2_1 > z^2)``.

References: B. L. Welch, "The generalization of 'Student's' problem when several different population
variances are involved", Biometrika 34 (1947) 28-35. F. E. Satterthwaite, "An approximate distribution of
estimates of variance components", Biometrics Bulletin 2 (1946) 110-114. Student, "The probable error of a
mean", Biometrika 6 (1908) 1-25. B. Efron, "Better bootstrap confidence intervals", Journal of the American
Statistical Association 82 (1987) 171-185. B. Efron and R. J. Tibshirani, "An Introduction to the Bootstrap",
Chapman & Hall (1993). S. Holm, "A simple sequentially rejective multiple test procedure", Scandinavian Journal
of Statistics 6 (1979) 65-70. J. Cohen, "Statistical Power Analysis for the Behavioral Sciences", 2nd ed.,
Erlbaum (1988). E. L. Kaplan and P. Meier, "Nonparametric estimation from incomplete observations", Journal of
the American Statistical Association 53 (1958) 457-481. N. Mantel, "Evaluation of survival data and two new
rank order statistics arising in its consideration", Cancer Chemotherapy Reports 50 (1966) 163-170.

Quantities that are undefined for the data at hand (a standard deviation from one seed, a test with fewer
than two seeds on a side, a test between two samples without any spread, a median steps-to-threshold when
most runs never reached the threshold) are ``None`` with a ``reason``, never NaN, so reports can print "n/a"
and JSON stays valid. NaN or infinite inputs are a ValueError.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import asdict, dataclass

__all__ = [
    "BootstrapCI",
    "LogrankResult",
    "Summary",
    "TTestResult",
    "ThresholdSummary",
    "WelchResult",
    "bootstrap_ci",
    "describe",
    "holm",
    "logrank",
    "min_detectable_difference",
    "paired_ttest",
    "threshold_summary",
    "welch_ttest",
]


@dataclass(frozen=True)
class Summary:
    """n, mean and sample standard deviation (ddof=1; None when n < 2) of a sample; mean is None when n == 0."""

    n: int
    mean: float | None
    std: float | None

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class TTestResult:
    """A two-sided t-test of sample a against sample b (Welch's or paired): ``t`` > 0 means a's mean is larger.

    ``t``, ``df`` and ``p`` are None when the test is undefined; ``reason`` then says why.
    """

    t: float | None
    df: float | None
    p: float | None
    reason: str | None = None

    def to_dict(self) -> dict:
        return asdict(self)


WelchResult = TTestResult
"""What :func:`welch_ttest` returns (the name it had before :func:`paired_ttest` shared the class)."""


@dataclass(frozen=True)
class BootstrapCI:
    """A bootstrap confidence interval ``[low, high]`` for ``difference = mean(a) - mean(b)``.

    ``method`` is "BCa", or "percentile" where BCa is undefined for the data (``reason`` says so) or where every
    resample gives the same difference (then ``low == high == difference``, and ``reason`` says so). ``low``,
    ``high`` and ``method`` are None when there is no interval (fewer than two values on a side); ``difference``
    is None only when a side is empty.
    """

    difference: float | None
    low: float | None
    high: float | None
    confidence: float
    method: str | None
    reason: str | None = None

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class ThresholdSummary:
    """Steps to reach a threshold over ``n`` runs, ``n_reached`` of which reached it (the rest were censored at
    their step cap).

    ``median`` is the Kaplan–Meier median steps-to-threshold: the smallest step at which the estimated fraction
    of runs not yet at the threshold is <= 1/2. Where that fraction stays above 1/2 up to the last step observed,
    ``median`` is None and the median is only known to exceed ``median_lower_bound`` (that last step);
    ``reason`` says why ``median`` is None.
    """

    n: int
    n_reached: int
    median: float | None
    median_lower_bound: float | None = None
    reason: str | None = None

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class LogrankResult:
    """The two-sided log-rank test of steps-to-threshold in a against b: ``statistic`` is ``z = (O_a - E_a) /
    sqrt(V)``, > 0 when a's runs reach the threshold sooner than under equal distributions; ``p`` its two-sided
    p-value. Both are None when the test is undefined; ``reason`` then says why.
    """

    statistic: float | None
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


def welch_ttest(a: Sequence[float], b: Sequence[float]) -> TTestResult:
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



def paired_ttest(a: Sequence[float], b: Sequence[float]) -> TTestResult:
    """Student's two-sided paired t-test of ``a[i]`` against ``b[i]`` (pairs: the same seed of two variants).

    ``t = mean(d) / (s_d / sqrt(n))`` with ``d = a - b`` and ``df = n - 1``, by :func:`scipy.stats.ttest_rel`.
    Samples of different lengths are a ValueError (they cannot be paired). Undefined cases give None fields and a
    ``reason``: fewer than two pairs, or all differences equal (``s_d = 0``: t is 0/0 or ±inf).
    """
    from scipy import stats

    xa, xb = _finite_floats(a, "sample a"), _finite_floats(b, "sample b")
    if len(xa) != len(xb):
        raise ValueError(f"a paired test needs samples of equal length (got {len(xa)} and {len(xb)})")
    if len(xa) < 2:
        return TTestResult(None, None, None, f"needs >= 2 pairs (got {len(xa)})")
    if len({x - y for x, y in zip(xa, xb)}) == 1:
        return TTestResult(None, None, None, "all paired differences are equal (zero variance)")
    with warnings.catch_warnings():  # near-identical differences: scipy warns about precision, the result is fine
        warnings.simplefilter("ignore", RuntimeWarning)
        res = stats.ttest_rel(xa, xb)
    return TTestResult(float(res.statistic), float(res.df), float(res.pvalue))


def _mean_difference(x, y, axis=-1):
    """``mean(x) - mean(y)`` along ``axis``: the unpaired bootstrap statistic (vectorized for scipy)."""
    return x.mean(axis=axis) - y.mean(axis=axis)


def bootstrap_ci(a: Sequence[float], b: Sequence[float], *, paired: bool, confidence: float = 0.95,
                 n_resamples: int = 9999, seed: int = 0) -> BootstrapCI:
    """A BCa bootstrap confidence interval (Efron 1987) for ``mean(a) - mean(b)``, reproducible for a ``seed``.

    ``paired``: ``a[i]`` and ``b[i]`` share seed i; the differences ``a - b`` are resampled and their mean is the
    statistic (samples of different lengths are a ValueError). Unpaired: ``a`` and ``b`` are resampled
    independently and the statistic is ``mean(a*) - mean(b*)``. Where BCa is undefined (scipy gives NaN, e.g. for
    near-degenerate data) the percentile interval of the same resamples is returned with ``method="percentile"``
    and a ``reason``; where no resample can differ from another (constant differences, or two constant samples)
    the interval is ``[difference, difference]`` with a ``reason``. Fewer than two values on a side: no interval.
    See the module docstring on coverage with few seeds.
    """
    import numpy as np
    from scipy import stats

    if not 0 < confidence < 1:
        raise ValueError(f"confidence must lie in (0, 1), got {confidence}")
    xa, xb = _finite_floats(a, "sample a"), _finite_floats(b, "sample b")
    if paired and len(xa) != len(xb):
        raise ValueError(f"a paired interval needs samples of equal length (got {len(xa)} and {len(xb)})")
    difference = math.fsum(xa) / len(xa) - math.fsum(xb) / len(xb) if xa and xb else None
    if len(xa) < 2 or len(xb) < 2:
        what = f"pairs (got {len(xa)})" if paired else f"values per sample (got {len(xa)} and {len(xb)})"
        return BootstrapCI(difference, None, None, confidence, None, f"needs >= 2 {what}")
    if paired:
        diffs = [x - y for x, y in zip(xa, xb)]
        difference = math.fsum(diffs) / len(diffs)
        data, statistic, constant = (np.asarray(diffs),), np.mean, len(set(diffs)) == 1
        if constant:
            difference = diffs[0]
    else:
        data, statistic = (np.asarray(xa), np.asarray(xb)), _mean_difference
        constant = len(set(xa)) == 1 and len(set(xb)) == 1
        if constant:
            difference = xa[0] - xb[0]
    if constant:
        return BootstrapCI(difference, difference, difference, confidence, "percentile",
                           "every resample gives the same difference (no spread in the data)")
    kwargs = dict(statistic=statistic, vectorized=True, paired=False, confidence_level=confidence)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        res = stats.bootstrap(data, n_resamples=n_resamples, method="BCa", rng=np.random.default_rng(seed), **kwargs)
    low, high = float(res.confidence_interval.low), float(res.confidence_interval.high)
    if math.isfinite(low) and math.isfinite(high):
        return BootstrapCI(difference, low, high, confidence, "BCa")
    why = "; ".join(sorted({str(w.message).split(". ")[0] for w in caught
                            if issubclass(w.category, stats.DegenerateDataWarning)})) or "BCa gave NaN"
    # the same resamples, their plain quantiles: n_resamples=0 adds none to the previous result's distribution
    res = stats.bootstrap(data, n_resamples=0, method="percentile", bootstrap_result=res,
                          rng=np.random.default_rng(seed), **kwargs)
    return BootstrapCI(difference, float(res.confidence_interval.low), float(res.confidence_interval.high),
                       confidence, "percentile", f"BCa undefined for these data ({why}); percentile interval")


def holm(pvalues: Sequence[float | None]) -> list[float | None]:
    """Holm-adjusted p-values (Holm 1979), in input order: reject where adjusted p <= alpha for a family-wise
    error rate alpha. ``None`` entries (comparisons that could not be tested) stay None and do not count in m.

    With the m p-values sorted ascending, ``p~_(k) = min(1, max_{j <= k} (m - j + 1) p_(j))``. A p-value outside
    [0, 1] or NaN is a ValueError.
    """
    ps = [None if p is None else float(p) for p in pvalues]
    bad = [p for p in ps if p is not None and not 0.0 <= p <= 1.0]  # NaN fails both comparisons
    if bad:
        raise ValueError(f"p-values must lie in [0, 1], got {bad}")
    order = sorted((i for i, p in enumerate(ps) if p is not None), key=lambda i: ps[i])
    m = len(order)
    out: list[float | None] = [None] * len(ps)
    running = 0.0
    for k, i in enumerate(order):  # k = 0..m-1, the multiplier m - (k+1) + 1 = m - k
        running = max(running, min(1.0, (m - k) * ps[i]))
        out[i] = running
    return out


def min_detectable_difference(sd: float | None, n_a: int, n_b: int | None = None, *, paired: bool,
                              alpha: float = 0.05, power: float = 0.8) -> float | None:
    """The smallest true difference of means that a two-sided t-test at level ``alpha`` detects with probability
    ``power``, exactly from the noncentral t distribution (see the module docstring).

    ``paired``: ``sd`` is the sample standard deviation of the paired differences and ``n_a`` the number of pairs
    (``n_b`` None or equal to it); df = n - 1. Unpaired: ``sd`` is the pooled standard deviation, ``n_a`` and
    ``n_b`` the sample sizes (``n_b`` None: equal to ``n_a``); df = n_a + n_b - 2. None where no t-test is
    defined: ``sd`` None or 0, or df < 1. Use it as "the seeds could have detected a difference of X" (with the
    caveat that sd is itself an estimate from the same few seeds).
    """
    from scipy import optimize, stats

    if not 0 < alpha < power < 1:
        raise ValueError(f"need 0 < alpha < power < 1, got alpha={alpha}, power={power}")
    if sd is None:
        return None
    sd = float(sd)
    if not math.isfinite(sd) or sd < 0:
        raise ValueError(f"sd must be finite and >= 0, got {sd}")
    if paired:
        if n_b is not None and n_b != n_a:
            raise ValueError(f"paired: n_b must be None or equal n_a (got {n_a} and {n_b})")
        df, scale = n_a - 1, 1 / math.sqrt(n_a) if n_a > 0 else math.inf
    else:
        n_b = n_a if n_b is None else n_b
        df = n_a + n_b - 2
        scale = math.sqrt(1 / n_a + 1 / n_b) if n_a > 0 and n_b > 0 else math.inf
    if sd == 0 or df < 1 or not math.isfinite(scale):
        return None
    crit = stats.t.isf(alpha / 2, df)
    nct = stats.nct

    def shortfall(nc: float) -> float:  # P(T' < -c) as P(-T' > c), -T' ~ nct(df, -nc): cdf gives NaN in far tails
        return nct.sf(crit, df, nc) + nct.sf(crit, df, -nc) - power

    hi = 1.0
    while shortfall(hi) < 0:  # power(0) = alpha < power; power grows with the noncentrality
        hi *= 2
    nc = optimize.brentq(shortfall, 0.0, hi, xtol=1e-13, rtol=1e-13)
    return nc * sd * scale


def _steps_and_flags(steps: Sequence[float], censored: Sequence[bool], what: str) -> tuple[list[float], list[bool]]:
    """``steps`` as finite floats and ``censored`` as bools, of equal length (else a ValueError)."""
    xs = _finite_floats(steps, f"steps{what}")
    flags = list(censored)
    if len(flags) != len(xs):
        raise ValueError(f"steps{what} and censored{what} differ in length ({len(xs)} and {len(flags)})")
    if any(f not in (True, False) for f in flags):
        raise ValueError(f"censored{what} must hold booleans, got {flags}")
    return xs, [bool(f) for f in flags]


def _censored_data(xs: list[float], flags: list[bool]):
    from scipy import stats

    return stats.CensoredData(uncensored=[x for x, c in zip(xs, flags) if not c],
                              right=[x for x, c in zip(xs, flags) if c])


_HALF = 0.5 * (1 + 1e-9)  # S(t) <= 1/2 up to rounding: products such as 5/6 * 4/5 * 3/4 come out a hair above 1/2


def threshold_summary(steps: Sequence[float], censored: Sequence[bool]) -> ThresholdSummary:
    """n, the number of runs that reached the threshold, and the Kaplan–Meier median steps-to-threshold.

    ``steps[i]`` is the step at which run i reached the threshold or, where ``censored[i]`` is True, the step cap
    at which it stopped without reaching it (right-censored). The Kaplan–Meier estimate (Kaplan and Meier 1958)
    is :func:`scipy.stats.ecdf` of :class:`scipy.stats.CensoredData`; its median is the smallest step at which the
    estimated fraction of runs not yet at the threshold is <= 1/2 (with nothing censored: the lower median of the
    steps). Where that fraction stays above 1/2 up to the last step observed, the median is None and only known
    to exceed ``median_lower_bound``.
    """
    from scipy import stats

    xs, flags = _steps_and_flags(steps, censored, "")
    n, n_reached = len(xs), flags.count(False)
    if n == 0:
        return ThresholdSummary(0, 0, None, None, "no runs")
    if n_reached == 0:
        return ThresholdSummary(n, 0, None, max(xs), "no run reached the threshold")
    sf = stats.ecdf(_censored_data(xs, flags)).sf
    below = [float(t) for t, s in zip(sf.quantiles, sf.probabilities) if s <= _HALF]
    if below:
        return ThresholdSummary(n, n_reached, below[0])
    last = float(sf.probabilities[-1])
    return ThresholdSummary(n, n_reached, None, max(xs),
                            f"the Kaplan-Meier fraction of runs not yet at the threshold is still {last:.3g} > 1/2 "
                            f"at the last step observed; the median exceeds it")


def logrank(steps_a: Sequence[float], censored_a: Sequence[bool], steps_b: Sequence[float],
            censored_b: Sequence[bool]) -> LogrankResult:
    """The two-sided log-rank test (Mantel 1966) of steps-to-threshold in a against b, by
    :func:`scipy.stats.logrank`; ``statistic`` > 0 means a's runs reach the threshold sooner.

    Arguments as in :func:`threshold_summary`, per sample. Undefined cases give None fields and a ``reason``:
    fewer than two runs on a side, no run reaching the threshold in either sample, or no run reaching it while
    runs of both samples were still at risk (zero variance).
    """
    from scipy import stats

    xa, fa = _steps_and_flags(steps_a, censored_a, "_a")
    xb, fb = _steps_and_flags(steps_b, censored_b, "_b")
    if len(xa) < 2 or len(xb) < 2:
        return LogrankResult(None, None, f"needs >= 2 runs per sample (got {len(xa)} and {len(xb)})")
    if all(fa) and all(fb):
        return LogrankResult(None, None, "no run reached the threshold in either sample")
    with warnings.catch_warnings():  # zero variance: scipy warns and returns NaN, reported below
        warnings.simplefilter("ignore", RuntimeWarning)
        res = stats.logrank(_censored_data(xa, fa), _censored_data(xb, fb))
    z, p = float(res.statistic), float(res.pvalue)
    if not (math.isfinite(z) and math.isfinite(p)):
        return LogrankResult(None, None, "no run reached the threshold while runs of both samples were at risk "
                                         "(zero variance)")
    return LogrankResult(z, p)

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
