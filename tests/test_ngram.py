"""Count n-gram reference losses: against a plain-Python float64 count, closed forms, and the trainer's targets."""

import math
from collections import Counter

import numpy as np
import pytest

from attnlab.analysis.ngram import ngram_loss
from attnlab.cli import main
from attnlab.errors import ConfigError


def counted_loss(train, val, order, vocab, alpha):
    """Straight from the formula: p(w | c) = (N(c, w) + alpha) / (N(c) + alpha V), one Python loop per count."""
    pairs = Counter(tuple(train[t - order + 1 : t + 1]) for t in range(order - 1, len(train)))
    contexts = Counter(tuple(train[t - order + 1 : t]) for t in range(order - 1, len(train)))
    total = 0.0
    targets = range(max(1, order - 1), len(val))
    for t in targets:
        ctx, w = tuple(val[t - order + 1 : t]), val[t]
        total -= math.log((pairs[ctx + (w,)] + alpha) / (contexts[ctx] + alpha * vocab))
    return total / len(targets)


@pytest.mark.parametrize("order", [1, 2, 3, 4])
@pytest.mark.parametrize("alpha", [0.01, 0.5])
def test_matches_a_plain_count(order, alpha):
    rng = np.random.default_rng(order)
    vocab = 5
    # a Markov-ish stream, so that higher orders see repeated and unseen contexts alike
    train = [int(v) for v in np.cumsum(rng.integers(0, 3, size=600)) % vocab]
    val = [int(v) for v in np.cumsum(rng.integers(0, 3, size=150)) % vocab]
    got = ngram_loss(np.array(train), np.array(val), order, vocab, alpha)
    assert got == pytest.approx(counted_loss(train, val, order, vocab, alpha), rel=1e-12)  # float64, summing order


def test_closed_forms():
    train, val = np.array([0, 1, 2] * 100), np.array([0, 1, 2] * 10)
    assert ngram_loss(train, val, 1, 3, 0.3) == pytest.approx(math.log(3), rel=1e-14)  # equal counts: p = 1/3
    a = 0.01  # pairs 0->1 and 1->2 follow contexts seen 100 times, 2->0 one seen 99 times (the last 2 ends train)
    want = -(20 * math.log((100 + a) / (100 + 3 * a)) + 9 * math.log((99 + a) / (99 + 3 * a))) / 29
    assert ngram_loss(train, val, 2, 3, a) == pytest.approx(want, rel=1e-14)
    # a context never seen in train gives the uniform 1 / V
    assert ngram_loss(np.zeros(50, int), np.array([1, 1]), 2, 7, 0.01) == pytest.approx(math.log(7), rel=1e-14)


@pytest.mark.parametrize("kwargs, words", [
    ({"order": 0}, ["order=0", ">= 1"]),
    ({"alpha": 0.0}, ["alpha=0.0", "> 0"]),
    ({"vocab_size": 3}, ["[0, 4]", "vocab_size=3"]),
    ({"order": 40}, ["order=40", "2 ** 62"]),
])
def test_bad_input_is_one_line(kwargs, words):
    args = {"train": np.arange(5), "val": np.arange(5), "order": 2, "vocab_size": 5, "alpha": 0.01, **kwargs}
    with pytest.raises(ConfigError) as err:
        ngram_loss(**args)
    assert "\n" not in str(err.value) and all(w in str(err.value) for w in words)


def test_cli_scores_the_trainers_validation_targets(capsys, tmp_path, monkeypatch):
    """`attnlab ngram --preset tiny` scores the targets of the tiny preset's evaluation: eval_tokens=2048 in
    windows of block_size=32 are 64 windows, whose targets are val[1:2049]."""
    monkeypatch.setenv("ATTNLAB_CACHE", str(tmp_path / "cache"))
    from attnlab.data.dataset import prepare
    from attnlab.presets import load_preset

    assert main(["ngram", "--preset", "tiny", "--orders", "1", "2", "--alpha", "0.1"]) == 0
    out = capsys.readouterr().out
    cfg = load_preset("tiny")
    ds = prepare(cfg.data)
    ys = np.concatenate([y.reshape(-1).numpy() for _, y in ds.val_batches(2048, 8, 32)])
    assert np.array_equal(ys, ds.val[1:2049])
    assert "on the 2,048 validation targets" in out
    for order, name in ((1, "unigram"), (2, "bigram")):
        want = ngram_loss(ds.train, ds.val[:2049], order, ds.vocab_size, 0.1)
        assert f"order {order} ({name}): {want:.4f}" in out
