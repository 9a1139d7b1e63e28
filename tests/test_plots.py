"""The comparison plots: the y-axis zoom leaves the steep start out; the loss-minus-baseline
curve and its band against a hand computation."""

import math
from dataclasses import dataclass, field

import numpy as np

from attnlab.experiments.plots import loss_deltas, plot_loss_deltas, plot_loss_curves, zoomed_limits


@dataclass
class _Run:  # the RunRecord fields the plots read
    variant: str
    curve: dict = field(default_factory=dict)
    usable: bool = True
    accuracy_curve: dict = field(default_factory=dict)
    summary: dict = field(default_factory=dict)
    not_converged: bool = False


def _runs():
    steps = [0, 100, 200, 300, 400]
    base = {0: [4.2, 2.0, 1.8, 1.7, 1.65], 1: [4.2, 2.1, 1.85, 1.72, 1.66], 2: [4.2, 1.95, 1.79, 1.69, 1.64]}
    other = {0: [4.2, 2.2, 1.9, 1.75, 1.70], 1: [4.2, 2.3, 1.92, 1.78, 1.71]}
    runs = [_Run("standard", {s: (s * 1000, v) for s, v in zip(steps, vals)}) for vals in base.values()]
    runs += [_Run("rbf", {s: (s * 1000, v) for s, v in zip(steps, vals)}) for vals in other.values()]
    runs.append(_Run("rbf", {0: (0, 9.9)}, usable=False))  # a diverged run: never averaged in
    return runs, base, other


def test_loss_deltas_against_a_hand_computation():
    runs, base, other = _runs()
    xs, delta, se = loss_deltas(runs, ["standard", "rbf"], "standard")["rbf"]
    b, o = np.array(list(base.values())), np.array(list(other.values()))
    assert xs == [0, 100_000, 200_000, 300_000, 400_000]
    np.testing.assert_allclose(delta, o.mean(0) - b.mean(0), atol=1e-12)
    expected = np.sqrt(o.var(0, ddof=1) / 2 + b.var(0, ddof=1) / 3)  # Welch's standard error of the difference
    np.testing.assert_allclose(se, expected, atol=1e-12)
    assert loss_deltas(runs, ["standard", "rbf"], "mqa") == {}  # no baseline runs: nothing to subtract


def test_zoom_leaves_the_first_fifth_out():
    low, high = zoomed_limits([([0, 100, 200, 300, 400], [4.2, 2.0, 1.8, 1.7, 1.65])])
    assert math.isclose(low, 1.65 - 0.05 * 0.35) and math.isclose(high, 2.0 + 0.05 * 0.35)  # 4.2 at x = 0 left out
    assert zoomed_limits([]) is None


def test_plots_are_written(tmp_path):
    runs, _, _ = _runs()
    assert plot_loss_deltas(runs, ["standard", "rbf"], "standard", tmp_path / "d.png").stat().st_size > 1000
    assert plot_loss_curves(runs, ["standard", "rbf"], tmp_path / "c.png").stat().st_size > 1000
    assert plot_loss_deltas(runs, ["standard"], "standard", tmp_path / "none.png") is None
