"""Count n-gram reference losses: what a model that sees only the last n - 1 tokens reaches.

A transformer whose attention contributes nothing still has the current token in its residual stream, so its
MLPs can learn p(next | current): the bigram loss is about where such a model ends. It is the yardstick for
the Boneless write-up's parameterless steps (README, "Training the six steps").

With counts N over the train split and additive (Lidstone) smoothing alpha over a vocabulary of V tokens
(Jurafsky & Martin, *Speech and Language Processing*, ch. 3):

    p(w | c) = (N(c, w) + alpha) / (N(c) + alpha V),        c = the n - 1 tokens before w

    loss = -(1/M) sum_t log p(val[t] | val[t-n+1 .. t-1])   (nats per token)

scored on the M validation targets the trainer evaluates, ``val[1 : W * block_size + 1]`` for its W windows
(:meth:`attnlab.data.dataset.Dataset.val_windows`). For n >= 3 the first n - 2 targets lack a full context and
are skipped, and a context may reach across a window boundary, where the model's does not (n - 2 of every
block_size targets).
"""

from __future__ import annotations

import numpy as np

from ..errors import ConfigError, check_number

__all__ = ["ngram_loss", "reference_losses"]

ORDER_NAMES = {1: "unigram", 2: "bigram", 3: "trigram"}


def _codes(seq: np.ndarray, order: int, vocab_size: int) -> tuple[np.ndarray, np.ndarray]:
    """(context code, next token) for every position t >= order - 1; the code is the base-V number of the n - 1
    tokens before t (0 for the unigram)."""
    n = len(seq) - order + 1
    ctx = np.zeros(max(n, 0), dtype=np.int64)
    for k in range(order - 1):
        ctx = ctx * vocab_size + seq[k : k + n]
    return ctx, seq[order - 1 :]


def _lookup(sorted_keys: np.ndarray, counts: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """counts[i] where sorted_keys[i] == key, else 0 (float64)."""
    i = np.minimum(np.searchsorted(sorted_keys, keys), len(sorted_keys) - 1)
    return np.where(sorted_keys[i] == keys, counts[i], 0).astype(np.float64)


def ngram_loss(train, val, order: int, vocab_size: int, alpha: float = 0.01) -> float:
    """Mean -log p(val[t] | the order - 1 tokens before it) over t >= max(1, order - 1), the counts taken on
    ``train``, smoothed by ``alpha`` (see the module docstring). Token ids must lie in [0, vocab_size)."""
    check_number("order", order, low=1, integer=True)
    check_number("alpha", alpha, low=0, low_open=True)
    check_number("vocab_size", vocab_size, low=1, integer=True)
    if vocab_size ** order >= 2 ** 62:
        raise ConfigError(f"order={order} with vocab_size={vocab_size} has too many n-grams to code in 64 bits "
                          f"(vocab_size ** order must be < 2 ** 62); use a lower order")
    train, val = np.asarray(train, dtype=np.int64), np.asarray(val, dtype=np.int64)
    for name, seq in (("train", train), ("val", val)):
        if len(seq) and (seq.min() < 0 or seq.max() >= vocab_size):
            raise ConfigError(f"{name} token ids span [{seq.min()}, {seq.max()}], outside [0, vocab_size={vocab_size})")
    skip = 1 if order == 1 else 0  # the first val token is never a target (no window predicts it)
    if len(train) < order or len(val) < max(2, order):
        raise ConfigError(f"order={order} needs at least {order} train and {max(2, order)} val tokens, "
                          f"got {len(train)} and {len(val)}")
    ctx, nxt = _codes(train, order, vocab_size)
    ctx_keys, ctx_counts = np.unique(ctx, return_counts=True)
    pair_keys, pair_counts = np.unique(ctx * vocab_size + nxt, return_counts=True)
    vctx, vnxt = (a[skip:] for a in _codes(val, order, vocab_size))
    n_pair = _lookup(pair_keys, pair_counts, vctx * vocab_size + vnxt)
    n_ctx = _lookup(ctx_keys, ctx_counts, vctx)
    return float(-np.mean(np.log((n_pair + alpha) / (n_ctx + alpha * vocab_size))))


def reference_losses(cfg, orders=(1, 2, 3), alpha: float = 0.01) -> dict:
    """The n-gram losses on the validation targets a run of ``cfg`` (a RunConfig) is evaluated on:
    {"orders": {n: loss}, "targets": M, "train_tokens": ..., "vocab_size": V, "alpha": alpha}."""
    from ..data.dataset import prepare

    ds = prepare(cfg.data)
    windows = ds.val_windows(cfg.train.eval_tokens, cfg.model.block_size)
    val = ds.val[: windows * cfg.model.block_size + 1]
    losses = {n: ngram_loss(ds.train, val, n, ds.vocab_size, alpha) for n in orders}
    return {"orders": losses, "targets": len(val) - 1, "train_tokens": len(ds.train),
            "vocab_size": ds.vocab_size, "alpha": alpha}
