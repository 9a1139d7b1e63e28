"""Associative recall: ``mqar`` (many queries after the bindings) and ``noisy-recall`` (recall inside a stream with
noise tokens between the pairs)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ..errors import ConfigError, strict_fields
from .base import Task, check_bool, check_int, distinct, power_law_slots, sorted_slots


@strict_fields
@dataclass(frozen=True)
class MQAR(Task):
    """Multi-query associative recall: key-value pairs, then queries that ask for the value bound to a key.

    Zoology's MQAR (Arora et al. 2023, arXiv:2312.04927), written here from the paper's description.

    Format. Token ids: ``0`` is the filler ``_``; keys ``k0..`` are ``1..n_keys``; values ``v0..`` are
    ``n_keys+1..n_keys+n_values``. The stream of T + 1 tokens is

    - the bindings: ``n_pairs`` pairs ``key value``, the keys distinct, each value drawn uniformly (values may
      repeat across keys);
    - the query region, the rest: ``n_queries`` pairs ``key value`` that repeat bindings, each bound key asked at
      most once and in random order, at random places among filler tokens (so the distance between a binding and
      its query varies).

    Query placement. By default every placement of the query pairs in the region is equally likely. With
    ``query_power = a`` the region is cut into aligned two-token slots and the queries take slots drawn one after
    another without replacement, slot g (1, 2, ... from the bindings) with probability proportional to
    g^(a - 1), the first drawn for the first binding, the next for the second, and so on: Zoology's power law for the gap between a
    binding and its query (its ``train_power_a``, 0.01 in Figure 2; a = 1 is uniform over the slots), so that
    queries fall near the bindings and in roughly their order.

    The answer positions are the queries: after reading a query key the model must give its value. Nothing else
    is scored, so every scored target is determined by the context.

    Chance. The value bound to a key is uniform over the n_values values and independent of the key and of the
    position, so no predictor that ignores the context (a constant, or any function of the current token and its
    position) does better than ``1 / n_values`` (1/12 = 0.0833 at the defaults).

    The defaults (6 pairs, 12 keys, 12 values, T = 32) are what a 2-layer, 128-wide, 4-head rope GPT learns to
    100% within 750 steps of 128 sequences at lr 1e-3 on the 2-core CPU, in seeds 0, 1 and 2 (the sanity anchor of
    the recall experiment; ``attnlab compare --experiment recall-mqar-1``). The batch matters more than the width or the
    learning rate: at batch 64, seed 0 stayed on a plateau near 48% for 3,500 steps. Harder settings plateau on such
    budgets: 8 pairs, 31 keys, 32 values at T = 64 stayed near 38% for 7,000 steps at width 64, answering the last
    queries of a sequence by elimination rather than recall.

    Example (``MQAR.tiny().example()``; ``y`` is the target under each input token)::

        >>> print(MQAR.tiny().example())
        mqar(n_pairs=3, n_keys=5, n_values=4, seq_len=15, n_queries=None, query_power=None); chance 0.2500
        x k3 v2 k2 v3 k1 v2 _ k2 v3 _ k3 v2 _ k1 v2
        y -  -  -  -  -  -  - v3 -  - v2 -  - v2 -
    """

    name: ClassVar[str] = "mqar"
    summary: ClassVar[str] = "multi-query associative recall: key-value pairs, then queries (Zoology, arXiv:2312.04927)"
    tiny_params: ClassVar[dict] = {"n_pairs": 3, "n_keys": 5, "n_values": 4, "seq_len": 15}

    n_pairs: int = 6
    """Key-value pairs per sequence (distinct keys); 2 * (n_pairs + n_queries) tokens must fit in seq_len + 1."""
    n_keys: int = 12
    """Keys in the vocabulary (at least n_pairs)."""
    n_values: int = 12
    """Values in the vocabulary (at least 2); chance accuracy is 1 / n_values."""
    seq_len: int = 32
    """T, the tokens of x and of y."""
    n_queries: int | None = None
    """Queries per sequence, each a different bound key (1..n_pairs); unset: every key is queried once."""
    query_power: float | None = None
    """Unset: queries placed uniformly. A number a > 0: two-token query slots drawn with probability proportional
    to g^(a - 1) for the g-th slot after the bindings (Zoology's power law; 0.01 in its Figure 2)."""

    def __post_init__(self):
        if self.query_power is not None and (isinstance(self.query_power, bool)
                                             or not isinstance(self.query_power, (int, float))
                                             or not self.query_power > 0 or self.query_power == float("inf")):
            raise ConfigError(f"data.task.query_power={self.query_power!r} is not allowed; use a finite number > 0 "
                              f"(Zoology's 0.01; 1 is uniform over the slots) or leave it unset")
        check_int("seq_len", self.seq_len, 4)
        check_int("n_keys", self.n_keys, 1)
        check_int("n_values", self.n_values, 2)
        total = self.seq_len + 1
        if self.n_queries is None:
            check_int("n_pairs", self.n_pairs, 1, min(self.n_keys, total // 4),
                      f"n_pairs <= n_keys = {self.n_keys}, and the pairs and one query per pair, "
                      f"4 * n_pairs tokens, must fit in seq_len + 1 = {total}")
        else:
            check_int("n_pairs", self.n_pairs, 1, min(self.n_keys, (total - 2) // 2),
                      f"n_pairs <= n_keys = {self.n_keys}, and 2 * n_pairs tokens plus one query must fit in "
                      f"seq_len + 1 = {total}")
            check_int("n_queries", self.n_queries, 1, min(self.n_pairs, (total - 2 * self.n_pairs) // 2),
                      f"at most n_pairs = {self.n_pairs} queries, and 2 * (n_pairs + n_queries) tokens must fit "
                      f"in seq_len + 1 = {total}")

    @property
    def queries(self) -> int:
        """The number of queries per sequence (n_queries, or n_pairs when unset)."""
        return self.n_pairs if self.n_queries is None else self.n_queries

    @property
    def vocab_size(self) -> int:
        return 1 + self.n_keys + self.n_values

    def token_name(self, token: int) -> str:
        if token == 0:
            return "_"
        return f"k{token - 1}" if token <= self.n_keys else f"v{token - 1 - self.n_keys}"

    def chance_accuracy(self) -> float:
        """``1 / n_values``: every answer is a value drawn uniformly, independently of the visible token and of
        the position, so the best context-free guess is right with probability 1 / n_values."""
        return 1.0 / self.n_values

    def _stream(self, n, rng):
        pairs, queries, total = self.n_pairs, self.queries, self.seq_len + 1
        keys = distinct(rng, n, self.n_keys, pairs) + 1
        values = rng.integers(0, self.n_values, size=(n, pairs)) + 1 + self.n_keys
        asked = distinct(rng, n, pairs, queries)  # which bindings are queried, in the order they are asked
        if self.query_power is None:
            starts = 2 * pairs + sorted_slots(rng, n, total - 2 * pairs, queries, width=2)
        else:  # Zoology's order: the bindings asked, first to last, take the slots in the order they are drawn
            asked = np.sort(asked, axis=1)
            starts = 2 * pairs + 2 * power_law_slots(rng, n, (total - 2 * pairs) // 2, queries, self.query_power)
        stream = np.zeros((n, total), dtype=np.int64)
        stream[:, 0:2 * pairs:2], stream[:, 1:2 * pairs:2] = keys, values
        rows = np.arange(n)[:, None]
        stream[rows, starts] = np.take_along_axis(keys, asked, axis=1)
        stream[rows, starts + 1] = np.take_along_axis(values, asked, axis=1)
        answer = np.zeros((n, self.seq_len), dtype=bool)
        answer[rows, starts] = True
        return stream, answer


@strict_fields
@dataclass(frozen=True)
class NoisyRecall(Task):
    """Noisy in-context recall: a stream of key-value pairs in which keys come back, with noise tokens between
    the pairs; each time a key comes back, the model must recall the value it was bound to.

    MAD's noisy in-context recall (Poli et al. 2024, arXiv:2403.17844), written here from the paper's description.

    Format. Token ids: keys ``k0..`` are ``0..n_keys-1``; values ``v0..`` are ``n_keys..n_keys+n_values-1``;
    noise ``n0..`` are the next ``noise_vocab`` ids. Each sequence binds ``n_pairs`` distinct keys to values drawn
    uniformly (its dictionary). The stream of T + 1 tokens is a random interleaving of ``n_noise`` noise tokens
    (one more when the parity of T + 1 - n_noise asks for it), each drawn uniformly from the noise vocabulary, and
    ``(T + 1 - n_noise) // 2`` pairs ``key value``, each key drawn uniformly from the dictionary and always followed
    by its own value. Noise never falls between a key and its value.

    The answer positions are the keys that occurred before in the stream: after reading such a key the model must
    give its value. A key's first occurrence is not scored (its value is not yet determined by the context). There
    are at least n_pairs + 1 pairs, so every sequence has at least one answer.

    Chance. Every answer is the value of a dictionary key, drawn uniformly and independently of the key and of
    the position, so a predictor that ignores the context reaches ``1 / n_values`` (0.0625 at the defaults).

    The plateau. A key comes back with its value each time, so the queried key's value is often the commonest
    value seen so far: answering that value scores 45% with 4 pairs of 8 keys and values at T = 32 (8 noise
    tokens), 27% at the defaults, and trained 2-layer GPTs sit on that plateau for thousands of steps
    (docs/tasks.md#status). With ``balanced=true`` every dictionary key occurs equally often (33% for the same
    rule with 4 pairs), a departure from MAD's independent draw. With ``bindings_first=true`` the first n_pairs
    pairs of the stream bind each dictionary key once, in random order, and every later pair is a query (keys
    uniform, or balanced); noise still falls anywhere. That is mqar with noise between the tokens, another
    departure from MAD, and it removes the frequency rule; but with 3 or more noise tokens in T = 32 the same
    GPTs stay on an elimination plateau near 49% for 2,000 steps, where one noise token is learned by step 375
    (docs/tasks.md#status). ``aligned_noise=true`` puts noise in runs of two, as MAD does, and ``n_noise_max``
    draws each sequence's noise count.

    Example (``NoisyRecall.tiny().example()``)::

        >>> print(NoisyRecall.tiny().example())
        noisy-recall(n_pairs=2, n_keys=3, n_values=4, noise_vocab=2, n_noise=4, n_noise_max=None, seq_len=16, balanced=False, aligned_noise=False, bindings_first=False); chance 0.2500
        x k1 v0 k2 v0 n0 n0 n1 k1 v0 k2 v0 n0 k2 v0 n1 k2
        y -  -  -  -  -  -  -  v0 -  v0 -  -  v0 -  -  v0
    """

    name: ClassVar[str] = "noisy-recall"
    summary: ClassVar[str] = "recall in a stream of key-value pairs with noise between them (MAD, arXiv:2403.17844)"
    tiny_params: ClassVar[dict] = {"n_pairs": 2, "n_keys": 3, "n_values": 4, "noise_vocab": 2, "n_noise": 4,
                                   "seq_len": 16}

    n_pairs: int = 8
    """Keys bound in each sequence (its dictionary), distinct; the stream's pairs draw their keys from them."""
    n_keys: int = 16
    """Keys in the vocabulary (at least n_pairs)."""
    n_values: int = 16
    """Values in the vocabulary (at least 2); chance accuracy is 1 / n_values."""
    noise_vocab: int = 16
    """Distinct noise tokens in the vocabulary."""
    n_noise: int = 16
    """Noise tokens per sequence (one more when needed to make the pairs fill seq_len + 1 exactly)."""
    n_noise_max: int | None = None
    """If set, each sequence draws its own noise count uniformly from n_noise..n_noise_max (as hijack's m_max)."""
    seq_len: int = 64
    """T, the tokens of x and of y."""
    balanced: bool = False
    """Draw the stream's keys so that every dictionary key occurs equally often (n_stream_pairs // n_pairs times,
    some once more), in random order, instead of each independently and uniformly (MAD's draw)."""
    aligned_noise: bool = False
    """Noise comes in runs of two tokens in the places of pairs, so every key sits at an even position (MAD's
    layout; one odd noise token, if any, goes last) instead of single noise tokens anywhere between pairs."""
    bindings_first: bool = False
    """The first n_pairs pairs bind every dictionary key once; the later pairs are all queries (mqar's order with
    noise between the tokens), instead of every pair drawing its key from the dictionary (MAD's stream)."""

    def __post_init__(self):
        check_int("seq_len", self.seq_len, 3)
        check_int("n_keys", self.n_keys, 1)
        check_int("n_values", self.n_values, 2)
        check_int("noise_vocab", self.noise_vocab, 1)
        check_int("n_pairs", self.n_pairs, 1, min(self.n_keys, (self.seq_len - 1) // 2),
                  f"n_pairs <= n_keys = {self.n_keys}, and n_pairs + 1 pairs must fit in seq_len + 1 = "
                  f"{self.seq_len + 1} tokens")
        check_int("n_noise", self.n_noise, 0, self.seq_len - 1 - 2 * self.n_pairs,
                  f"at least n_pairs + 1 = {self.n_pairs + 1} pairs must fit in seq_len + 1 = {self.seq_len + 1} "
                  f"tokens beside the noise")
        if self.n_noise_max is not None:
            check_int("n_noise_max", self.n_noise_max, self.n_noise, self.seq_len - 1 - 2 * self.n_pairs,
                      f"at least n_noise = {self.n_noise}, and n_pairs + 1 = {self.n_pairs + 1} pairs must fit in "
                      f"seq_len + 1 = {self.seq_len + 1} tokens beside the noise")
        check_bool("noisy-recall", "balanced", self.balanced)
        check_bool("noisy-recall", "bindings_first", self.bindings_first)
        check_bool("noisy-recall", "aligned_noise", self.aligned_noise)

    @property
    def n_stream_pairs(self) -> int:
        """Pairs in each stream: (seq_len + 1 - n_noise) // 2."""
        return (self.seq_len + 1 - self.n_noise) // 2

    @property
    def vocab_size(self) -> int:
        return self.n_keys + self.n_values + self.noise_vocab

    def token_name(self, token: int) -> str:
        if token < self.n_keys:
            return f"k{token}"
        if token < self.n_keys + self.n_values:
            return f"v{token - self.n_keys}"
        return f"n{token - self.n_keys - self.n_values}"

    def chance_accuracy(self) -> float:
        """``1 / n_values``: every answer is a value drawn uniformly, independently of the visible token and of
        the position, so the best context-free guess is right with probability 1 / n_values."""
        return 1.0 / self.n_values

    def _stream(self, n, rng):
        if self.n_noise_max is not None:  # each sequence its own noise count: generate each count's rows apart
            levels = rng.integers(self.n_noise, self.n_noise_max + 1, size=n)
            stream = np.zeros((n, self.seq_len + 1), dtype=np.int64)
            answer = np.zeros((n, self.seq_len), dtype=bool)
            for level in np.unique(levels):
                rows = np.flatnonzero(levels == level)
                stream[rows], answer[rows] = self.replace(n_noise=int(level), n_noise_max=None)._stream(len(rows), rng)
            return stream, answer
        total, pairs = self.seq_len + 1, self.n_stream_pairs
        span = 2 if self.aligned_noise else 1  # tokens per noise unit
        noise = (total - 2 * pairs) // span  # noise units (aligned: an odd token left over goes last)
        units = pairs + noise
        keys = distinct(rng, n, self.n_keys, self.n_pairs)
        values = rng.integers(0, self.n_values, size=(n, self.n_pairs)) + self.n_keys
        is_noise = np.zeros((n, units), dtype=bool)
        np.put_along_axis(is_noise, distinct(rng, n, units, noise), True, axis=1)
        which = rng.integers(0, self.n_pairs, size=(n, units))  # the dictionary entry of each pair unit
        noise_tok = rng.integers(0, self.noise_vocab, size=(n, units, span)) + self.n_keys + self.n_values
        if self.balanced:  # each entry pairs // n_pairs times, or once more, in random order
            entries = np.resize(np.arange(self.n_pairs), pairs)[np.argsort(rng.random((n, pairs)), axis=1)]
            which[~is_noise] = entries.ravel()  # row-major: each row has exactly `pairs` pair units
        if self.bindings_first:  # a permutation of the dictionary, then the queries (balanced or uniform)
            rest = pairs - self.n_pairs
            queries = (np.resize(np.arange(self.n_pairs), rest)[np.argsort(rng.random((n, rest)), axis=1)]
                       if self.balanced else rng.integers(0, self.n_pairs, size=(n, rest)))
            entries = np.concatenate([distinct(rng, n, self.n_pairs, self.n_pairs), queries], axis=1)
            which[~is_noise] = entries.ravel()

        length = np.where(is_noise, span, 2)
        start = np.cumsum(length, axis=1) - length
        rows = np.broadcast_to(np.arange(n)[:, None], (n, units))
        stream = np.zeros((n, total), dtype=np.int64)
        for s in range(span):
            stream[rows[is_noise], start[is_noise] + s] = noise_tok[..., s][is_noise]
        if span * noise + 2 * pairs < total:  # the odd token left over by aligned noise
            stream[:, -1] = rng.integers(0, self.noise_vocab, size=n) + self.n_keys + self.n_values
        pair = ~is_noise
        stream[rows[pair], start[pair]] = np.take_along_axis(keys, which, axis=1)[pair]
        stream[rows[pair], start[pair] + 1] = np.take_along_axis(values, which, axis=1)[pair]

        onehot = (which[..., None] == np.arange(self.n_pairs)) & pair[..., None]
        before = np.cumsum(onehot, axis=1) - onehot  # occurrences of each entry in earlier units
        seen = np.take_along_axis(before, which[..., None], axis=2)[..., 0] > 0
        answer = np.zeros((n, self.seq_len), dtype=bool)
        hit = pair & seen
        answer[rows[hit], start[hit]] = True
        return stream, answer
