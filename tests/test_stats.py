"""attnlab.experiments.stats beyond describe/Welch (those are in test_compare.py): the paired t-test, the bootstrap
interval, Holm's adjustment, the minimum detectable difference and steps-to-threshold with censoring, each against
an independent computation (the formula written out here, statsmodels, or a hand-worked example)."""

from __future__ import annotations

import gc
import math
import random
import statistics
from fractions import Fraction

import numpy as np
import pytest
import scipy.stats
from statsmodels.stats.multitest import multipletests
from statsmodels.stats.power import TTestIndPower, TTestPower

from attnlab.experiments import stats as S
from attnlab.experiments.stats import (BootstrapCI, LogrankResult, ThresholdSummary, TTestResult, WelchResult,
                                       bootstrap_ci, holm, logrank, min_detectable_difference, paired_ttest,
                                       threshold_summary, welch_ttest)


def test_public_names():
    assert WelchResult is TTestResult and isinstance(welch_ttest([1, 2, 3], [2, 3, 5]), WelchResult)
    assert all(hasattr(S, name) for name in S.__all__)
    for name in ("paired_ttest", "bootstrap_ci", "holm", "min_detectable_difference", "threshold_summary",
                 "logrank", "BootstrapCI", "ThresholdSummary", "LogrankResult", "TTestResult", "WelchResult"):
        assert name in S.__all__


# ------------------------------------------------------------------------------------------------ paired t-test


def paired_by_hand(a, b):
    """Student's paired t: t = mean(d) / (s_d / sqrt(n)), df = n - 1, p = 2 * P(T_df > |t|)."""
    d = [x - y for x, y in zip(a, b)]
    n = len(d)
    m = sum(d) / n
    sd = math.sqrt(sum((x - m) ** 2 for x in d) / (n - 1))
    t = m / (sd / math.sqrt(n))
    return t, n - 1, 2 * scipy.stats.t.sf(abs(t), n - 1)


@pytest.mark.parametrize("n,seed_sd,noise,shift", [(2, 0.3, 0.05, 0.1), (5, 0.2, 0.02, 0.01), (10, 1.0, 0.1, -0.05),
                                                   (7, 0.0, 0.5, 0.0)])
def test_paired_matches_formula(n, seed_sd, noise, shift):
    rng = random.Random(n * 31 + int(noise * 100))
    seed_effect = [rng.gauss(0, seed_sd) for _ in range(n)]
    a = [2.0 + shift + s + rng.gauss(0, noise) for s in seed_effect]
    b = [2.0 + s + rng.gauss(0, noise) for s in seed_effect]
    res = paired_ttest(a, b)
    t, df, p = paired_by_hand(a, b)
    assert res.reason is None
    assert res.t == pytest.approx(t, rel=1e-9)
    assert res.df == df
    assert res.p == pytest.approx(p, rel=1e-9)
    assert 0 < res.p <= 1
    flipped = paired_ttest(b, a)
    assert flipped.t == pytest.approx(-res.t, rel=1e-12) and flipped.p == pytest.approx(res.p, rel=1e-12)


def test_paired_known_value_and_sign():
    # d = [1, 0, 2]: mean 1, s_d = 1, t = 1 / (1/sqrt(3)) = sqrt(3), df = 2, p = 2 * (1/2 - atan(sqrt(3)/sqrt(2)) ...)
    res = paired_ttest([1, 2, 3], [0, 2, 1])
    assert res.t == pytest.approx(math.sqrt(3), rel=1e-12)
    assert res.df == 2
    # t with 2 df has the closed form sf(t) = 1/2 - t / (2 sqrt(t^2 + 2))
    assert res.p == pytest.approx(2 * (0.5 - math.sqrt(3) / (2 * math.sqrt(5))), rel=1e-12)


def test_paired_removes_the_shared_seed_effect():
    rng = random.Random(0)
    seed_effect = [rng.gauss(0, 1.0) for _ in range(8)]
    a = [s + 0.1 + rng.gauss(0, 0.02) for s in seed_effect]
    b = [s + rng.gauss(0, 0.02) for s in seed_effect]
    assert paired_ttest(a, b).p < 1e-3 < 0.5 < welch_ttest(a, b).p


def test_paired_undefined_and_invalid():
    one = paired_ttest([1.0], [2.0])
    assert (one.t, one.df, one.p) == (None, None, None) and "2 pairs" in one.reason
    assert paired_ttest([], []).reason
    same = paired_ttest([1.0, 2.0, 3.0], [0.0, 1.0, 2.0])  # every difference is exactly 1
    assert same.to_dict() == {"t": None, "df": None, "p": None, "reason": same.reason} and "equal" in same.reason
    with pytest.raises(ValueError, match="equal length"):
        paired_ttest([1.0, 2.0, 3.0], [1.0, 2.0])
    with pytest.raises(ValueError, match="non-finite"):
        paired_ttest([1.0, float("nan")], [1.0, 2.0])
    with pytest.raises(ValueError, match="non-finite"):
        paired_ttest([1.0, 2.0], [1.0, float("inf")])


# ------------------------------------------------------------------------------------------------------ bootstrap


def bca_by_hand(d, n_resamples, confidence, seed):
    """Efron (1987) BCa for the mean of d, written out, with its own resamples; also the percentile interval."""
    rng = np.random.default_rng(seed)
    d = np.asarray(d, dtype=float)
    n, theta = len(d), d.mean()
    boots = d[rng.integers(0, n, (n_resamples, n))].mean(axis=1)
    z0 = scipy.stats.norm.ppf(np.mean(boots < theta))
    jack = (d.sum() - d) / (n - 1)
    u = jack.mean() - jack
    a = (u**3).sum() / (6 * ((u**2).sum()) ** 1.5)
    z = scipy.stats.norm.ppf([(1 - confidence) / 2, (1 + confidence) / 2])
    levels = scipy.stats.norm.cdf(z0 + (z0 + z) / (1 - a * (z0 + z)))
    return np.quantile(boots, levels), np.quantile(boots, [(1 - confidence) / 2, (1 + confidence) / 2])


def test_bootstrap_paired_is_bca_of_the_differences():
    # right-skewed differences, where BCa and the percentile interval differ clearly at the upper end
    d = [0.1, 0.2, 0.15, 0.3, 2.5, 0.05, 0.4, 0.12, 0.9, 0.22]
    b = [1.0 + 0.1 * i for i in range(10)]
    a = [x + y for x, y in zip(d, b)]
    res = bootstrap_ci(a, b, paired=True, n_resamples=50_000, seed=1)
    (lo, hi), (plo, phi) = bca_by_hand(d, 50_000, 0.95, seed=7)
    assert res.method == "BCa" and res.reason is None and res.confidence == 0.95
    assert res.difference == pytest.approx(statistics.mean(d), rel=1e-12)
    assert abs(phi - hi) > 0.2  # the check below can tell BCa from the percentile interval
    assert res.low == pytest.approx(lo, abs=0.03)
    assert res.high == pytest.approx(hi, abs=0.05)


def test_bootstrap_reproducible_and_seeded():
    rng = random.Random(3)
    a = [rng.gauss(0.2, 1) for _ in range(8)]
    b = [rng.gauss(0.0, 1) for _ in range(8)]
    for paired in (True, False):
        r1 = bootstrap_ci(a, b, paired=paired, n_resamples=999, seed=5)
        r2 = bootstrap_ci(a, b, paired=paired, n_resamples=999, seed=5)
        r3 = bootstrap_ci(a, b, paired=paired, n_resamples=999, seed=6)
        assert r1 == r2
        assert (r1.low, r1.high) != (r3.low, r3.high)
        assert r1.low < r1.difference < r1.high
        assert r1.difference == pytest.approx(statistics.mean(a) - statistics.mean(b), rel=1e-12)
        assert isinstance(r1, BootstrapCI) and r1.to_dict()["method"] == "BCa"


def test_bootstrap_coverage_near_nominal():
    """200 simulated comparisons with 20 seeds a side: the 95% interval holds the true difference 0.3 at a rate in
    a binomial band around 0.95 (3 sd: 0.904..0.996; an interval of the wrong width would leave it)."""
    rng = np.random.default_rng(2024)
    for paired in (True, False):
        covered = 0
        for rep in range(200):
            seed_effect = rng.normal(0, 1, 20) if paired else np.zeros(20)
            a = seed_effect + 0.3 + rng.normal(0, 1, 20)
            b = seed_effect + rng.normal(0, 1, 20)
            res = bootstrap_ci(a, b, paired=paired, n_resamples=999, seed=rep)
            covered += res.low <= 0.3 <= res.high
        assert 0.90 <= covered / 200 <= 0.99, (paired, covered)


def test_bootstrap_paired_narrower_when_seeds_correlate():
    rng = np.random.default_rng(0)
    seed_effect = rng.normal(0, 1.0, 8)
    a = seed_effect + 0.1 + rng.normal(0, 0.05, 8)
    b = seed_effect + rng.normal(0, 0.05, 8)
    paired = bootstrap_ci(a, b, paired=True, n_resamples=999)
    unpaired = bootstrap_ci(a, b, paired=False, n_resamples=999)
    assert paired.high - paired.low < 0.2 * (unpaired.high - unpaired.low)
    assert paired.low > 0 > unpaired.low  # only the paired interval excludes 0


def test_bootstrap_constant_and_small():
    res = bootstrap_ci([2.5, 3.5, 4.5], [2.0, 3.0, 4.0], paired=True)  # every difference is 0.5
    assert (res.difference, res.low, res.high) == (0.5, 0.5, 0.5)
    assert res.reason and "same" in res.reason
    res = bootstrap_ci([0.1] * 7, [0.3] * 5, paired=False)  # two constant samples
    assert res.low == res.high == res.difference == 0.1 - 0.3 and res.reason
    small = bootstrap_ci([1.0], [2.0, 3.0], paired=False)
    assert (small.low, small.high, small.method) == (None, None, None) and ">= 2" in small.reason
    assert small.difference == -1.5
    assert bootstrap_ci([], [], paired=True).to_dict() == {
        "difference": None, "low": None, "high": None, "confidence": 0.95, "method": None,
        "reason": "needs >= 2 pairs (got 0)"}
    assert bootstrap_ci([1.0], [2.0], paired=True).reason


def test_bootstrap_falls_back_to_percentile():
    """With two resamples BCa's bias correction is often infinite (both resamples on one side): the percentile
    interval of the same resamples comes back instead, and says so."""
    fell_back = [bootstrap_ci([0.0, 1.0, 2.0], [0.0, 0.0, 0.0], paired=True, n_resamples=2, seed=s)
                 for s in range(40)]
    fell_back = [r for r in fell_back if r.method != "BCa"]
    assert fell_back
    for r in fell_back:
        assert r.method == "percentile" and "BCa" in r.reason
        assert 0.0 <= r.low <= r.high <= 2.0 and math.isfinite(r.low)


def test_bootstrap_invalid():
    with pytest.raises(ValueError, match="equal length"):
        bootstrap_ci([1.0, 2.0], [1.0, 2.0, 3.0], paired=True)
    with pytest.raises(ValueError, match="non-finite"):
        bootstrap_ci([1.0, float("nan")], [1.0, 2.0], paired=False)
    with pytest.raises(ValueError, match="confidence"):
        bootstrap_ci([1.0, 2.0], [1.0, 3.0], paired=True, confidence=95)


# ------------------------------------------------------------------------------------------------------------ Holm


def test_holm_hand_worked():
    # sorted: 0.005*4 = 0.02, 0.01*3 = 0.03, 0.03*2 = 0.06, 0.04*1 = 0.04 -> running max 0.06
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02], rel=1e-12)
    got = holm([0.01, None, 0.04, 0.03])  # m = 3: 0.03, 0.06, max(0.06, 0.04)
    assert got[1] is None and [got[0], got[2], got[3]] == pytest.approx([0.03, 0.06, 0.06], rel=1e-12)
    assert holm([0.6, 0.7]) == [1.0, 1.0]  # capped
    assert holm([0.02]) == [0.02]
    assert holm([]) == [] and holm([None, None]) == [None, None]


@pytest.mark.parametrize("seed", range(8))
def test_holm_matches_statsmodels(seed, monkeypatch):
    monkeypatch.setattr(gc, "collect", lambda *args: 0)  # multipletests(method="holm") collects: slow, and not needed here
    rng = random.Random(seed)
    m = rng.randint(1, 25)
    pool = [rng.random() ** 3 for _ in range(5)]  # a few repeated values: ties
    ps = [rng.choice(pool) if rng.random() < 0.3 else rng.random() ** 2 for _ in range(m)]
    expected = multipletests(ps, method="holm")[1]
    assert holm(ps) == pytest.approx(list(expected), rel=1e-12, abs=1e-15)
    # the same with untestable comparisons interleaved: None stays, and m counts only the real p-values
    mixed, where = [], []
    for p in ps:
        while rng.random() < 0.3:
            mixed.append(None)
        where.append(len(mixed))
        mixed.append(p)
    got = holm(mixed)
    assert [got[i] for i in where] == pytest.approx(list(expected), rel=1e-12, abs=1e-15)
    assert all(got[i] is None for i in range(len(mixed)) if i not in where)


def test_holm_invalid():
    for bad in (float("nan"), -0.01, 1.5):
        with pytest.raises(ValueError):
            holm([0.1, bad])


# ------------------------------------------------------------------------------------ minimum detectable difference


@pytest.mark.parametrize("n", [2, 3, 5, 10, 30])
def test_mdd_paired_matches_statsmodels(n):
    sd = 0.07
    got = min_detectable_difference(sd, n, paired=True)
    effect = TTestPower().solve_power(effect_size=None, nobs=n, alpha=0.05, power=0.8, alternative="two-sided")
    assert got == pytest.approx(effect * sd, rel=2e-6)  # statsmodels' own solver stops near 1e-6
    if n > 2:  # df = 1: statsmodels' lower tail nct.cdf(-c) is NaN at this noncentrality
        assert TTestPower().power(got / sd, nobs=n, alpha=0.05) == pytest.approx(0.8, abs=1e-9)
    nc, df = got / sd * math.sqrt(n), n - 1
    c = scipy.stats.t.isf(0.025, df)
    assert scipy.stats.nct.sf(c, df, nc) + scipy.stats.nct.sf(c, df, -nc) == pytest.approx(0.8, abs=1e-9)


@pytest.mark.parametrize("n_a,n_b", [(2, 2), (5, 5), (3, 8), (10, 10), (7, 4)])
def test_mdd_unpaired_matches_statsmodels(n_a, n_b):
    sd = 1.3
    got = min_detectable_difference(sd, n_a, n_b, paired=False)
    effect = TTestIndPower().solve_power(effect_size=None, nobs1=n_a, ratio=n_b / n_a, alpha=0.05, power=0.8,
                                         alternative="two-sided")
    assert got == pytest.approx(effect * sd, rel=2e-6)
    assert TTestIndPower().power(got / sd, nobs1=n_a, ratio=n_b / n_a, alpha=0.05) == pytest.approx(0.8, abs=1e-9)


def test_mdd_properties():
    # other alpha and power, against statsmodels too
    got = min_detectable_difference(2.0, 6, paired=True, alpha=0.01, power=0.9)
    assert got == pytest.approx(2.0 * TTestPower().solve_power(None, nobs=6, alpha=0.01, power=0.9), rel=2e-6)
    # linear in sd, falls with n, n_b defaults to n_a, and exceeds the normal approximation (t has heavier tails)
    one = min_detectable_difference(1.0, 5, paired=True)
    assert min_detectable_difference(3.0, 5, paired=True) == pytest.approx(3 * one, rel=1e-9)
    mdds = [min_detectable_difference(1.0, n, paired=True) for n in range(2, 12)]
    assert all(x > y for x, y in zip(mdds, mdds[1:]))
    assert min_detectable_difference(1.0, 6, paired=False) == min_detectable_difference(1.0, 6, 6, paired=False)
    normal = (scipy.stats.norm.isf(0.025) + scipy.stats.norm.ppf(0.8)) * math.sqrt(2 / 6)
    assert min_detectable_difference(1.0, 6, paired=False) > 1.05 * normal


def test_mdd_undefined_and_invalid():
    assert min_detectable_difference(None, 5, paired=True) is None
    assert min_detectable_difference(0.0, 5, paired=True) is None
    assert min_detectable_difference(1.0, 1, paired=True) is None
    assert min_detectable_difference(1.0, 1, 1, paired=False) is None
    assert min_detectable_difference(1.0, 0, 5, paired=False) is None
    with pytest.raises(ValueError):
        min_detectable_difference(float("nan"), 5, paired=True)
    with pytest.raises(ValueError):
        min_detectable_difference(-1.0, 5, paired=True)
    with pytest.raises(ValueError):
        min_detectable_difference(1.0, 5, paired=True, alpha=0.05, power=0.04)
    with pytest.raises(ValueError):
        min_detectable_difference(1.0, 5, 6, paired=True)


# --------------------------------------------------------------------------------- steps to threshold, censored


def km_median_by_hand(steps, censored):
    """Kaplan–Meier (1958) in exact fractions: at each step where runs reach the threshold, S *= 1 - d/n with n the
    runs still at risk (a run censored at that step counts as at risk); the median is the first step with S <= 1/2."""
    s = Fraction(1)
    for t in sorted(set(steps)):
        at_risk = sum(1 for x in steps if x >= t)
        d = sum(1 for x, c in zip(steps, censored) if x == t and not c)
        if d:
            s *= 1 - Fraction(d, at_risk)
            if s <= Fraction(1, 2):
                return t
    return None


def test_km_median_hand_worked():
    # 100 reached (6 at risk): S = 5/6; 150 censored; 200 reached (4 at risk): S = 5/8; 250 reached (3 at risk):
    # S = 5/12 <= 1/2 -> median 250 (the median of the reached steps alone would be 200)
    res = threshold_summary([100, 150, 200, 250, 300, 300], [False, True, False, False, True, True])
    assert res == ThresholdSummary(n=6, n_reached=3, median=250.0)
    # S = 5/6 * 4/5 * 3/4 = 1/2 exactly at 300: the median is 300, not the next step
    res = threshold_summary([100, 200, 300, 300, 300, 300], [False, False, False, True, True, True])
    assert res.median == 300.0
    # S = 8/10 * 7/8 * 5/7 = 1/2 at 400, which scipy's product gives as 0.5000000000000001: still the median
    res = threshold_summary([100, 100, 200, 400, 400, 500, 600, 600, 700, 800], [False] * 9 + [True])
    assert res.median == 400.0
    # one run reaches the threshold at the cap where two others stop: those two are still at risk, S = 2/3
    res = threshold_summary([300, 300, 300], [False, True, True])
    assert res.median is None and res.median_lower_bound == 300.0 and "0.667" in res.reason


def test_km_median_uncensored_is_the_lower_median():
    rng = random.Random(1)
    for n in range(1, 12):
        steps = [rng.randrange(100, 2000, 50) for _ in range(n)]
        res = threshold_summary(steps, [False] * n)
        assert res.n == res.n_reached == n and res.reason is None
        assert res.median == statistics.median_low(steps)
        if n % 2:
            assert res.median == statistics.median(steps)


@pytest.mark.parametrize("seed", range(6))
def test_km_median_matches_exact_fractions(seed):
    rng = random.Random(seed)
    n = rng.randint(3, 12)
    cap = 1000
    steps, censored = [], []
    for _ in range(n):
        if rng.random() < 0.35:
            steps.append(rng.choice([cap, rng.randrange(200, cap, 100)]))  # stopped at a cap (sometimes early)
            censored.append(True)
        else:
            steps.append(rng.randrange(100, cap + 1, 100))  # integer steps on a grid: ties
            censored.append(False)
    res = threshold_summary(steps, censored)
    expected = km_median_by_hand(steps, censored)
    assert res.n_reached == censored.count(False)
    assert res.median == expected
    if expected is None:
        assert res.median_lower_bound == max(steps) and res.reason


def test_threshold_summary_mostly_censored_and_invalid():
    res = threshold_summary([100, 500, 500, 500], [False, True, True, True])
    assert (res.median, res.median_lower_bound, res.n_reached) == (None, 500.0, 1) and "0.75" in res.reason
    res = threshold_summary([500, 500], [True, True])
    assert res.to_dict() == {"n": 2, "n_reached": 0, "median": None, "median_lower_bound": 500.0,
                             "reason": "no run reached the threshold"}
    assert threshold_summary([], []).reason == "no runs"
    with pytest.raises(ValueError, match="length"):
        threshold_summary([1, 2], [False])
    with pytest.raises(ValueError, match="non-finite"):
        threshold_summary([1, float("nan")], [False, False])
    with pytest.raises(ValueError, match="boolean"):
        threshold_summary([1, 2], [False, "yes"])


def logrank_by_hand(xa, ca, xb, cb):
    """Mantel (1966): O - E and V over the distinct steps where some run reached the threshold."""
    o = e = v = 0.0
    for t in sorted({x for x, c in zip(xa + xb, ca + cb) if not c}):
        na = sum(x >= t for x in xa)
        nb = sum(x >= t for x in xb)
        da = sum(x == t and not c for x, c in zip(xa, ca))
        d = da + sum(x == t and not c for x, c in zip(xb, cb))
        n = na + nb
        o += da
        e += na * d / n
        if n > 1:
            v += na * nb * d * (n - d) / (n * n * (n - 1))
    z = (o - e) / math.sqrt(v)
    return z, scipy.stats.chi2.sf(z * z, 1)


def test_logrank_hand_worked():
    # a: reached at 10, 30; b: reached at 20, stopped at 40. Steps 10 (2+2 at risk), 20 (1+2), 30 (1+1):
    # O_a = 2, E_a = 1/2 + 1/3 + 1/2 = 4/3, V = 1/4 + 2/9 + 1/4 = 13/18, z^2 = (2/3)^2 / (13/18) = 8/13
    res = logrank([10, 30], [False, False], [20, 40], [False, True])
    assert res.statistic == pytest.approx(math.sqrt(8 / 13), rel=1e-12)  # > 0: a reaches it sooner
    assert res.p == pytest.approx(scipy.stats.chi2.sf(8 / 13, 1), rel=1e-12)
    assert isinstance(res, LogrankResult) and res.reason is None
    flipped = logrank([20, 40], [False, True], [10, 30], [False, False])
    assert flipped.statistic == pytest.approx(-res.statistic) and flipped.p == pytest.approx(res.p)


@pytest.mark.parametrize("seed", range(5))
def test_logrank_matches_mantel_by_hand(seed):
    rng = random.Random(seed)

    def sample(n, scale):
        xs = [min(1000, 100 * round(rng.expovariate(1 / scale) / 100 + 1)) for _ in range(n)]
        return xs, [x == 1000 for x in xs]

    xa, ca = sample(rng.randint(3, 9), 400)
    xb, cb = sample(rng.randint(3, 9), 700)
    res = logrank(xa, ca, xb, cb)
    z, p = logrank_by_hand(xa, ca, xb, cb)
    assert res.statistic == pytest.approx(z, rel=1e-9)
    assert res.p == pytest.approx(p, rel=1e-9)


def test_logrank_monotone_in_the_gap():
    a = [100, 200, 300, 400, 500]
    ps = [logrank(a, [False] * 5, [x + shift for x in a], [False] * 5).p for shift in (0, 50, 150, 300, 600)]
    assert ps[0] == pytest.approx(1.0)
    assert all(x > y for x, y in zip(ps, ps[1:]))


def test_logrank_undefined_and_invalid():
    assert logrank([10], [False], [20, 30], [False, False]).reason.startswith("needs >= 2")
    none = logrank([500, 500], [True, True], [500, 500], [True, True])
    assert (none.statistic, none.p) == (None, None) and "either" in none.reason
    # b's runs reach it only after a's runs have all stopped: no step with both at risk, V = 0
    zero = logrank([10, 10], [True, True], [20, 30], [False, False])
    assert (zero.statistic, zero.p) == (None, None) and "variance" in zero.reason
    with pytest.raises(ValueError, match="non-finite"):
        logrank([1, float("inf")], [False, False], [1, 2], [False, False])
    with pytest.raises(ValueError, match="length"):
        logrank([1, 2], [False], [1, 2], [False, False])
