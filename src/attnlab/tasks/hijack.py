"""``hijack``: the magnitude write-up's probability hijacking as a recall task, with the size of the hijacking cluster as a knob."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ..errors import ConfigError, strict_fields
from .base import Task, check_bool, check_int, distinct

PAD, MARK, QUERY = 0, 1, 2
"""Token ids of the filler, the marker and the query token; keys start at 3."""

OTHER, UNIQUE, CLUSTER, QUERY_POS = 0, 1, 2, 3
"""The values of :meth:`Hijack.roles`."""

SWEEP_M = (0, 4, 16, 64)
"""The cluster sizes a hijack run is evaluated at (those its capacity allows; attnlab.train.hooks.HijackSweepHook)."""


@strict_fields
@dataclass(frozen=True)
class Hijack(Task):
    """Recall one marked binding while m unmarked copies of the same key, all bound to one distractor value,
    compete for the query's attention: the "probability hijacking" of the magnitude write-up (docs/sources.md#magnitude-attention) as a
    task.

    Format. Token ids: ``0`` is the filler ``_``, ``1`` the marker ``*``, ``2`` the query token ``?``; keys
    ``k0..`` are ``3..n_keys+2``; values ``v0..`` are ``n_keys+3..n_keys+n_values+2``. The stream of T + 1 tokens
    is: one filler token when the parity needs it; then the *records*, in random order; then ``n_queries``
    queries ``? key value`` (``* key value`` with ``marked_query=true``), the last of them the hijack query
    ``? k v``. The records are

    - ``n_marked`` marked bindings ``* key value`` with distinct keys and values drawn uniformly; the first of them
      is the *target* binding ``* k v``;
    - m *cluster* copies ``k d``: the target key, unmarked, each bound to the same distractor value d, drawn
      uniformly from the values other than v;
    - ``capacity - m`` neutral bindings ``key value``, unmarked, each key drawn uniformly from the keys other than k
      (they may repeat a marked key) and each value uniformly;

    where ``capacity = (T + 1 - 3 * n_marked - 3 * n_queries) // 2``, so the length does not depend on m. With
    ``neutral=false`` filler pairs ``_ _`` take the neutral bindings' places, and with ``packed=true`` as well
    they all come first, the bindings after them. A query
    asks for its key's *marked* binding; the answer positions are the query keys (after reading a query's key, the
    model must give the value of that key's marked binding). The last query is the hijack query: it asks for k, at
    the last position (after reading it the model must give v). The ``n_queries - 1`` queries before it ask other
    marked keys, distinct, in random order: they are not hijacked (a control, and more answers to learn from).
    Keep n_queries well below n_marked: the last query's answer is otherwise narrowed down by elimination (with
    n_queries = n_marked it is the one marked value not asked yet). With ``m_max`` set, each sequence draws its
    own m uniformly from m..m_max.

    The design argument. (a) At m = 0 this is ordinary associative recall among n_marked marked bindings (plus
    unmarked bindings of other keys), which standard attention solves (tests/test_tasks.py trains a 2-layer GPT to
    it; a slow test). (b) The m cluster copies are exact
    repeats of the target's key token, i.e. a true cluster: a query that matches the key's identity with score s
    and the marker with an extra margin g gives the target binding the share e^g / (e^g + m) of the mass on k's
    occurrences, so as m grows the cluster's summed mass overtakes the unique key unless g grows like log m
    (g = log m for a tie: 2.8 at m = 16, 4.2 at m = 64). The cluster's values all say d, so a hijacked readout
    answers d rather than noise. The query must use both features: the marker alone is shared with the other
    marked bindings, the key alone with the cluster, and neutral bindings make unmarked copies of other keys
    common, so "the marked key that repeats" is no shortcut. (c) The answer is always determined by the context:
    exactly one marked binding has the query's key, and d differs from v.

    :meth:`roles` marks the target's key position 1, each cluster copy's key position 2 and the hijack query's
    position 3, always the last (each binding's value is at the next position). With n_queries > 1 the accuracy
    that measures hijacking is the accuracy at the role-3 position; the other queries' accuracy is a control.
    Chance: every answer is a value drawn uniformly, independent of the visible token and of the position, so a
    predictor that ignores the context reaches ``1 / n_values`` (0.03125 at the defaults); a fully hijacked model
    answers d at the hijack query and scores 0 there.

    Defaults: T = 160 holds 8 marked bindings, two queries and a capacity of 65 unmarked bindings, so m can be
    swept over 0..65 (e.g. 0, 4, 16, 64) at a fixed length. The sweep protocol: train on ``m=0, m_max=64`` (each
    sequence its own m), then evaluate each m alone with :meth:`at_m`. With n_queries = 4 at m up to 64, use
    T = 163 (capacity 64). Learnability (measured on CPU at m = 0, 2-layer GPTs, batch 64 to 256): with one query
    per sequence the models stayed on the plateau "answer one of the marked values" (accuracy ~0.39 with 4 marked
    bindings) for 4000 steps and more; with ``n_queries=2`` (4 marked, 8 keys, 8 values, T = 23, width 64,
    lr 1e-3, batch 128) the recall was learned between steps 1500 and 2000, to accuracy 1.0. So train with a few
    queries and measure hijacking at the role-3 position.

    Fused bindings (``fused=true``). Each binding is one token ``k<a>=v<b>``: the marked binding ``* k=v``, the
    cluster copies ``k=d`` (m copies of one token), the neutral bindings ``k'=v'``, a filler record one ``_``;
    ``capacity = T + 1 - 2 * n_marked - 3 * n_queries``. This is the magnitude write-up's scenario in its plainest form: the
    cluster is m exact duplicates of one token, so the first layer's keys of the copies are equal (attnlab's
    magnitude gate reads the keys before RoPE), and one attention hop from the query key to the binding token
    answers the query. The target ``k=v`` and the copies ``k=d`` share the key but are different tokens, so a
    model can match on the key alone (and is then hijacked as m grows) or also check the marker before it.
    :meth:`binding_key` gives the key of each token for :meth:`roles`; a binding's mass is its one position
    (``binding_len`` 1). Example with ``neutral=false``::

        x _ _ k3=v2 _ k3=v2 * k2=v3 _ _ _ * k3=v0 _ _ ? k3
        y - - -     - -     - -     - - - - -     - - - v0

    Example (``Hijack.tiny().example()``)::

        >>> print(Hijack.tiny().example())
        hijack(n_marked=2, n_keys=4, n_values=4, n_queries=1, m=2, m_max=None, neutral=True, packed=False, fused=False, marked_query=False, seq_len=16); chance 0.2500
        x * k2 v3 k3 v2 k2 v2 k1 v2 * k3 v0 k3 v2 ? k3
        y - -  -  -  -  -  -  -  -  - -  -  -  -  - v0
    """

    name: ClassVar[str] = "hijack"
    summary: ClassVar[str] = ("recall a marked binding while m unmarked copies of its key compete for the query's "
                              "attention (the magnitude write-up)")
    tiny_params: ClassVar[dict] = {"n_marked": 2, "n_keys": 4, "n_values": 4, "n_queries": 1, "m": 2, "seq_len": 16}

    n_marked: int = 8
    """Marked bindings per sequence, distinct keys, one of them the queried one (1..n_keys)."""
    n_keys: int = 32
    """Keys in the vocabulary (at least 2)."""
    n_values: int = 32
    """Values in the vocabulary (at least 2); chance accuracy is 1 / n_values."""
    n_queries: int = 2
    """Queries per sequence (1..n_marked), each a distinct marked key; the last is the hijack query (role 3)."""
    m: int = 0
    """Cluster size: unmarked copies of the queried key bound to the distractor (0..capacity); with m_max set, the
    smallest size drawn."""
    m_max: int | None = None
    """If set, each sequence draws its cluster size uniformly from m..m_max (m..capacity); unset: every sequence
    has m."""
    neutral: bool = True
    """Fill the capacity the cluster leaves with neutral bindings ``key value`` of other keys (True), or with filler
    pairs ``_ _`` (False: the cluster and the marked bindings are then the only bindings, which is learned much
    faster at long T)."""
    packed: bool = False
    """With neutral=false: the filler pairs come first and the bindings (marked and cluster, in random order)
    after them, just before the queries, instead of filler and bindings shuffled together. The bindings then span
    3 n_marked + 2 m tokens whatever T is, so small clusters are short-range recall."""
    fused: bool = False
    """Write each binding as one token ``k<a>=v<b>`` (n_keys * n_values binding tokens, ids after the values)
    instead of the two tokens ``key value``: a marked binding is ``* k<a>=v<b>``, a cluster copy ``k<a>=v<d>``, a
    filler record one ``_``. The cluster copies are then one repeated token, exact duplicates in the embedding (and
    in the keys of the first layer); a 1-hop lookup solves the task (no previous-token head needed), and the
    records take 2 n_marked + m tokens, so T = 97 holds m = 64 beside 8 marked bindings and 6 queries."""
    marked_query: bool = False
    """Write each query ``* key`` instead of ``? key``: a query is then the prefix of the marked binding it asks
    for, so a two-token match (the marker before the key) finds the target, as an induction head would; the cluster
    copies match only the key token. False keeps the query token ``?``."""
    seq_len: int = 160
    """T, the tokens of x and of y; it sets the capacity, (T + 1 - 3 * n_marked - 3 * n_queries) // 2."""

    def __post_init__(self):
        check_int("seq_len", self.seq_len, 5)
        for name in ("neutral", "packed", "fused", "marked_query"):
            check_bool("hijack", name, getattr(self, name))
        if self.packed and self.neutral:
            raise ConfigError("hijack: packed=true needs neutral=false (it moves the filler pairs first; neutral "
                              "bindings are not filler)")
        check_int("n_keys", self.n_keys, 2)
        check_int("n_values", self.n_values, 2)
        r = self._marked_len
        check_int("n_marked", self.n_marked, 1, min(self.n_keys, (self.seq_len - 2) // r),
                  f"n_marked <= n_keys = {self.n_keys}, and {r} * n_marked tokens plus the query must fit in "
                  f"seq_len + 1 = {self.seq_len + 1}")
        check_int("n_queries", self.n_queries, 1, min(self.n_marked, (self.seq_len + 1 - r * self.n_marked) // 3),
                  f"n_queries <= n_marked = {self.n_marked}, and {r} * n_marked + 3 * n_queries tokens must fit in "
                  f"seq_len + 1 = {self.seq_len + 1}")
        formula = ("seq_len + 1 - 2 * n_marked - 3 * n_queries" if self.fused
                   else "(seq_len + 1 - 3 * n_marked - 3 * n_queries) // 2")
        why = (f"capacity = {formula} = {self.capacity} unmarked bindings at seq_len={self.seq_len}, "
               f"n_marked={self.n_marked}, n_queries={self.n_queries}")
        check_int("m", self.m, 0, self.capacity, why)
        if self.m_max is not None:
            check_int("m_max", self.m_max, self.m, self.capacity, "at least m; " + why)

    @property
    def _marked_len(self) -> int:
        """Tokens of a marked binding: ``* key value``, or ``* k=v`` when fused."""
        return 2 if self.fused else 3

    @property
    def binding_len(self) -> int:
        """Tokens of an unmarked binding, from its key position on: 2 (``key value``), or 1 when fused."""
        return 1 if self.fused else 2

    @property
    def capacity(self) -> int:
        """The unmarked bindings per sequence (cluster copies plus neutral ones), the largest m allowed."""
        free = self.seq_len + 1 - self._marked_len * self.n_marked - 3 * self.n_queries
        return free // self.binding_len

    @property
    def _fused_base(self) -> int:
        """The id of the first binding token ``k0=v0`` (fused); binding k=v is ``_fused_base + k * n_values + v``."""
        return 3 + self.n_keys + self.n_values

    @property
    def vocab_size(self) -> int:
        return self._fused_base + (self.n_keys * self.n_values if self.fused else 0)

    def binding_key(self, x: np.ndarray) -> np.ndarray:
        """The key token id of each token of x: the token itself for a key, the key of a fused binding token
        ``k=v``, and -1 for every other token."""
        x = np.asarray(x)
        is_key = (x >= 3) & (x < 3 + self.n_keys)
        fused = x >= self._fused_base
        return np.where(is_key, x, np.where(fused, (x - self._fused_base) // max(self.n_values, 1) + 3, -1))

    def at_m(self, m: int) -> "Hijack":
        """The same task with every sequence at cluster size m (for evaluating one m of a sweep)."""
        return self.replace(m=m, m_max=None)

    def sweep(self, ms=None) -> dict[str, "Hijack"]:
        """{"m<m>": the task at m} for each m of ``ms`` (default :data:`SWEEP_M`) that the capacity allows: the
        cells the hijack sweep evaluates (attnlab.train.hooks.HijackSweepHook)."""
        return {f"m{m}": self.at_m(m) for m in (SWEEP_M if ms is None else ms) if m <= self.capacity}

    def token_name(self, token: int) -> str:
        if token < 3:
            return "_*?"[token]
        if token >= self._fused_base:
            key, value = divmod(token - self._fused_base, self.n_values)
            return f"k{key}=v{value}"
        return f"k{token - 3}" if token < 3 + self.n_keys else f"v{token - 3 - self.n_keys}"

    def chance_accuracy(self) -> float:
        """``1 / n_values``: the answer v is uniform over the values and independent of the visible token (the
        query key) and of the position."""
        return 1.0 / self.n_values

    def _stream(self, n, rng):
        total, marked, cap, queries = self.seq_len + 1, self.n_marked, self.capacity, self.n_queries
        lead = total - 3 * queries - self._marked_len * marked - self.binding_len * cap  # 0 or 1 filler token
        high = self.m if self.m_max is None else self.m_max
        m = rng.integers(self.m, high + 1, size=n)

        keys = distinct(rng, n, self.n_keys, marked) + 3  # marked keys; column 0 is the target's
        values = rng.integers(0, self.n_values, size=(n, marked))
        target, answer_value = keys[:, 0], values[:, 0]
        distractor = (answer_value + 1 + rng.integers(0, self.n_values - 1, size=n)) % self.n_values
        room = max(cap, 1)  # draw at least one column so the gathers below never index an empty array
        other = rng.integers(0, self.n_keys - 1, size=(n, room)) + 3
        other += other >= target[:, None]  # neutral keys skip the target key
        other_values = rng.integers(0, self.n_values, size=(n, room))
        record = distinct(rng, n, marked + cap, marked + cap)  # record slot -> item, a random order
        if self.packed:  # the idle items (filler pairs) first, the bindings after them in their random order
            idle_first = np.argsort(record - marked < m[:, None], axis=1, kind="stable")
            record = np.take_along_axis(record, idle_first, axis=1)

        # items 0..marked-1: the marked bindings (0 the target's); then m cluster copies; then neutral bindings
        is_marked = record < marked
        unmarked = np.clip(record - marked, 0, room - 1)  # index among the unmarked items
        is_cluster = ~is_marked & (record - marked < m[:, None])
        length = np.where(is_marked, self._marked_len, self.binding_len)
        start = lead + np.cumsum(length, axis=1) - length
        marked_idx = np.minimum(record, marked - 1)
        take = lambda table, idx: np.take_along_axis(table, idx, axis=1)
        key = np.where(is_marked, take(keys, marked_idx),
                       np.where(is_cluster, target[:, None], take(other, unmarked)))
        value = np.where(is_marked, take(values, marked_idx),
                         np.where(is_cluster, distractor[:, None], take(other_values, unmarked)))
        idle = ~is_marked & ~is_cluster & (not self.neutral)  # slots of filler pairs (a filler token when fused)
        stream = np.zeros((n, total), dtype=np.int64)
        rows = np.broadcast_to(np.arange(n)[:, None], start.shape)
        key_pos = start + is_marked
        stream[rows[is_marked], start[is_marked]] = MARK
        if self.fused:  # one token k=v per binding
            stream[rows, key_pos] = np.where(idle, PAD, self._fused_base + (key - 3) * self.n_values + value)
        else:
            stream[rows, key_pos] = np.where(idle, PAD, key)
            stream[rows, key_pos + 1] = np.where(idle, PAD, value + 3 + self.n_keys)
        asked = np.concatenate([distinct(rng, n, marked - 1, queries - 1) + 1, np.zeros((n, 1), np.int64)], axis=1)
        first = total - 3 * queries  # the queries: other marked items in random order, then the target (item 0)
        stream[:, first::3] = MARK if self.marked_query else QUERY
        stream[:, first + 1::3] = np.take_along_axis(keys, asked, axis=1)
        stream[:, first + 2::3] = np.take_along_axis(values, asked, axis=1) + 3 + self.n_keys
        answer = np.zeros((n, self.seq_len), dtype=bool)
        answer[:, first + 1::3] = True
        return stream, answer

    def roles(self, x: np.ndarray) -> np.ndarray:
        """int8 [n, T] from the tokens of x: 1 at the target key (the key token after a marker that equals the
        query's key), 2 at each cluster copy (an unmarked occurrence of the query's key before the query), 3 at the
        query position (the last, whose target is the answer), 0 elsewhere. The value of a binding sits at the
        position after its key. ``(roles == 2).sum(1)`` is each sequence's m."""
        x = np.asarray(x)
        if x.ndim != 2 or x.shape[1] != self.seq_len:
            raise ValueError(f"x must have shape [n, {self.seq_len}], got {list(x.shape)}")
        query_key = x[:, -1:]
        after_mark = np.zeros(x.shape, dtype=bool)
        after_mark[:, 1:] = x[:, :-1] == MARK
        body = np.ones(x.shape, dtype=bool)
        body[:, x.shape[1] + 1 - 3 * self.n_queries:] = False  # the query section
        hit = (self.binding_key(x) == query_key) & body
        roles = np.zeros(x.shape, dtype=np.int8)
        roles[hit & after_mark] = UNIQUE
        roles[hit & ~after_mark] = CLUSTER
        roles[:, -1] = QUERY_POS
        return roles
