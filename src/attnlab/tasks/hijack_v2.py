"""``hijack-v2``: the magnitude write-up's hijacking with the answer under a cluster defined by training, on exact and on
near-duplicate clusters (version 1, ``hijack``, is kept as it was)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ..errors import ConfigError, strict_fields
from .base import Task, check_int, distinct
from .hijack import CLUSTER, QUERY_POS, UNIQUE

MARK, QUERY = 0, 1
"""Token ids of the marker ``*`` and the query token ``?``; key tokens start at 2."""

SWEEP_M = (0, 4, 8, 16, 32)
"""The cluster sizes a hijack-v2 run is evaluated at (those below its capacity)."""
MEDIOCRE_M = (8, 32)
"""The sizes at which the mediocre cluster (target spelled as the query, copies in other spellings) is evaluated."""
CLUSTERS = ("exact", "synonym")
"""How the m cluster copies are written: one token repeated, or each copy with its own synonym of the key."""
TARGET_SYNONYMS = ("any", "query")
"""Which synonym the target binding uses: any (drawn like every other), or the query's own."""


@strict_fields
@dataclass(frozen=True)
class HijackV2(Task):
    """Recall the marked binding of the queried key while m unmarked bindings of the same key, all to one distractor
    value, compete for the query's attention: the "probability hijacking" of the magnitude write-up (docs/sources.md#magnitude-attention), with
    near-synonym clusters and the answer under a cluster defined by what the model was trained on.

    Format. Keys come in synonym groups: key a has ``synonyms`` spellings ``k<a>.<s>``, and a binding written with
    any spelling of a binds a. Every binding is one token ``k<a>.<s>=v<b>``. The stream of T + 1 tokens is the
    *records* in random order, then ``n_queries`` queries ``? k<a>.<s> v<b>``. The records are

    - ``n_marked`` marked bindings ``* k<a>.<s>=v<b>`` with distinct keys a and uniform values b; the first is the
      *target* ``* k.s=v``;
    - m *cluster* copies, unmarked bindings of the target's key to one distractor value d != v: with
      ``cluster="exact"`` one token ``k.c=d`` repeated m times (c a random spelling); with ``cluster="synonym"``
      each copy draws its own spelling, so the copies are similar but not identical tokens;
    - ``n_unmarked`` unmarked bindings ``k<a>.<s>=v<b>`` of keys other than the target's, uniform values (they may
      repeat a marked key with another value);
    - filler tokens ``f<i>`` in the remaining ``capacity - m`` slots, distinct within a sequence (drawn without
      replacement from ``capacity`` filler tokens), so no filler token repeats;

    where ``capacity = T + 1 - 2 n_marked - n_unmarked - 3 n_queries``. A query ``? k.s`` asks for the value of the
    *marked* binding of key k, written with any spelling; its answer position is the query key. The last query is
    the hijack query (the target's key); the ``n_queries - 1`` before it ask other marked keys, distinct, in random
    order. Each spelling in the stream is drawn uniformly, independently of the others, except the target's with
    ``target_synonym="query"``: it is then the query's own spelling, so the target matches the query token for
    token and each cluster copy only through its key's synonymy (the magnitude write-up's mediocre cluster against one perfect
    key). With ``m_max`` set, each sequence draws its own m uniformly from m..m_max.

    The design argument. (a) The rule is defined by training: with ``n_unmarked > 0`` unmarked bindings of
    marked keys to other values appear in every sequence (and with m_max > 0 unmarked bindings of the queried key
    itself), and the answer is always the marked binding's value. A model that fits the training distribution
    therefore ignores unmarked bindings; a cluster at test time differs only in how many there are and that they
    agree (unlike version 1 trained with ``neutral=false``, where no unmarked binding ever appears). (b) The
    cluster is a true cluster: m bindings of the target's key that all say d, so a readout hijacked by their summed
    mass answers d. With ``cluster="exact"`` the copies are one token (exact duplicates: a count of identical
    tokens finds them); with ``cluster="synonym"`` and ``synonyms`` >= m they are mostly distinct tokens whose
    embeddings agree only as far as the model has learned the synonymy, which a count of identical tokens cannot
    see (the near-synonym claim of the magnitude write-up). (c) The answer is always determined: exactly one marked binding has
    the query's key, and d != v. (d) No filler token repeats, and the largest m leaves ``capacity - m`` fillers
    (``m < capacity`` is enforced), so a prior that discounts repeated tokens gets no free start from the filler
    and a large cluster does not change the rest of the sequence into one token.

    :meth:`roles` marks the target binding 1, each unmarked binding of the target's key 2 (the cluster) and the
    hijack query's position 3, the last. Chance: every answer is a value drawn uniformly, independent of the
    query's token and of the position, so a predictor that ignores the context reaches ``1 / n_values``.

    Example (``HijackV2.tiny().example()``)::

        >>> print(HijackV2.tiny().example())
        hijack-v2(n_marked=2, n_keys=4, n_values=4, synonyms=2, n_unmarked=1, n_queries=1, m=2, m_max=None, cluster='synonym', target_synonym='any', seq_len=14); chance 0.2500
        x f5 * k3.1=v0 f4 k2.1=v2 f0 f6 k3.1=v2 f3 * k2.1=v3 k3.1=v2 ? k3.1
        y -  - -       -  -       -  -  -       -  - -       -       - v0
    """

    name: ClassVar[str] = "hijack-v2"
    summary: ClassVar[str] = ("recall a marked binding against m unmarked bindings of its key, exact or near-synonym "
                              "copies, with unmarked bindings in training (the magnitude write-up)")
    tiny_params: ClassVar[dict] = {"n_marked": 2, "n_keys": 4, "n_values": 4, "synonyms": 2, "n_unmarked": 1,
                                   "n_queries": 1, "m": 2, "seq_len": 14}

    n_marked: int = 6
    """Marked bindings per sequence, distinct keys, one of them the queried one (1..n_keys)."""
    n_keys: int = 8
    """Keys (synonym groups) in the vocabulary (at least 2)."""
    n_values: int = 8
    """Values in the vocabulary (at least 2); chance accuracy is 1 / n_values."""
    synonyms: int = 4
    """Spellings of each key (1: no synonyms, every binding of a key is the same token for a given value)."""
    n_unmarked: int = 4
    """Unmarked bindings of keys other than the target's per sequence (they define the rule "unmarked bindings do
    not answer" in training)."""
    n_queries: int = 4
    """Queries per sequence (1..n_marked), each a distinct marked key; the last is the hijack query."""
    m: int = 0
    """Cluster size (0..capacity - 1); with m_max set, the smallest size drawn."""
    m_max: int | None = None
    """If set, each sequence draws its cluster size uniformly from m..m_max (at most capacity - 1)."""
    cluster: str = "synonym"
    """``"exact"``: the m copies are one token; ``"synonym"``: each copy has its own spelling of the key."""
    target_synonym: str = "any"
    """``"any"``: the target's spelling is drawn like every other; ``"query"``: it is the query's spelling."""
    seq_len: int = 64
    """T, the tokens of x and of y; capacity = T + 1 - 2 n_marked - n_unmarked - 3 n_queries."""

    def __post_init__(self):
        check_int("seq_len", self.seq_len, 5)
        check_int("n_keys", self.n_keys, 2)
        check_int("n_values", self.n_values, 2)
        check_int("synonyms", self.synonyms, 1)
        if self.cluster not in CLUSTERS or self.target_synonym not in TARGET_SYNONYMS:
            bad, allowed = (("cluster", CLUSTERS) if self.cluster not in CLUSTERS
                            else ("target_synonym", TARGET_SYNONYMS))
            raise ConfigError(f"data.task.{bad}={getattr(self, bad)!r} is not allowed; choose one of: "
                              f"{', '.join(map(repr, allowed))}")
        check_int("n_marked", self.n_marked, 1, min(self.n_keys, (self.seq_len - 2) // 2),
                  f"n_marked <= n_keys = {self.n_keys}, and 2 * n_marked tokens plus a query must fit in seq_len + 1 "
                  f"= {self.seq_len + 1}")
        check_int("n_queries", self.n_queries, 1, min(self.n_marked, (self.seq_len + 1 - 2 * self.n_marked) // 3),
                  f"n_queries <= n_marked = {self.n_marked}, and 2 * n_marked + 3 * n_queries tokens must fit in "
                  f"seq_len + 1 = {self.seq_len + 1}")
        room = self.seq_len + 1 - 2 * self.n_marked - 3 * self.n_queries
        check_int("n_unmarked", self.n_unmarked, 0, room - 1,
                  f"leave room for one filler: seq_len + 1 - 2 * n_marked - 3 * n_queries = {room}")
        why = (f"m < capacity = seq_len + 1 - 2 * n_marked - n_unmarked - 3 * n_queries = {self.capacity}: the "
               f"largest cluster must leave filler")
        check_int("m", self.m, 0, self.capacity - 1, why)
        if self.m_max is not None:
            check_int("m_max", self.m_max, self.m, self.capacity - 1, "at least m; " + why)

    # ------------------------------------------------------------------------------------------------ token ids

    @property
    def capacity(self) -> int:
        """Slots for the cluster and the filler; the largest m allowed is capacity - 1."""
        return self.seq_len + 1 - 2 * self.n_marked - self.n_unmarked - 3 * self.n_queries

    @property
    def _n_spellings(self) -> int:
        return self.n_keys * self.synonyms

    @property
    def _value_base(self) -> int:
        return 2 + self._n_spellings

    @property
    def _binding_base(self) -> int:
        return self._value_base + self.n_values

    @property
    def _filler_base(self) -> int:
        return self._binding_base + self._n_spellings * self.n_values

    @property
    def vocab_size(self) -> int:
        return self._filler_base + self.capacity

    binding_len: ClassVar[int] = 1
    """Tokens of a binding from its key position on (one token ``k.s=v``; attnlab.analysis.task_mass)."""

    def binding_key(self, x: np.ndarray) -> np.ndarray:
        """The key (synonym group, 0..n_keys-1) of each key token or binding token of x; -1 for every other token."""
        x = np.asarray(x)
        spelling = np.where((x >= 2) & (x < self._value_base), x - 2,
                            np.where((x >= self._binding_base) & (x < self._filler_base),
                                     (x - self._binding_base) // self.n_values, -1))
        return np.where(spelling >= 0, spelling // self.synonyms, -1)

    def at_m(self, m: int, cluster: str | None = None, target_synonym: str | None = None) -> "HijackV2":
        """The same task with every sequence at cluster size m (and, if given, another cluster kind or target
        spelling): one cell of the hijack sweep."""
        return self.replace(m=m, m_max=None, cluster=cluster or self.cluster,
                            target_synonym=target_synonym or self.target_synonym)

    def sweep(self, ms=None) -> dict[str, "HijackV2"]:
        """The cells the hijack sweep evaluates (attnlab.train.hooks.HijackSweepHook), for each m of ``ms`` (default
        :data:`SWEEP_M`) below the capacity: ``exact-m<m>`` (one token repeated), ``synonym-m<m>`` (m > 0: each
        copy its own spelling), and at the m of :data:`MEDIOCRE_M` ``mediocre-m<m>`` (a synonym cluster against a
        target spelled as the query: the magnitude write-up's mediocre cluster keys against one perfect key); with one spelling per
        key (``synonyms=1``) only the exact cells."""
        ms = [m for m in (SWEEP_M if ms is None else ms) if m < self.capacity]
        cells = {f"exact-m{m}": self.at_m(m, "exact", "any") for m in ms}
        if self.synonyms == 1:  # every copy is then one token: the other kinds are the exact cells again
            return cells
        cells |= {f"synonym-m{m}": self.at_m(m, "synonym", "any") for m in ms if m > 0}
        cells |= {f"mediocre-m{m}": self.at_m(m, "synonym", "query") for m in ms if m in MEDIOCRE_M}
        return cells

    def token_name(self, token: int) -> str:
        if token < 2:
            return "*?"[token]
        if token < self._value_base:
            key, syn = divmod(token - 2, self.synonyms)
            return f"k{key}.{syn}"
        if token < self._binding_base:
            return f"v{token - self._value_base}"
        if token < self._filler_base:
            spelling, value = divmod(token - self._binding_base, self.n_values)
            key, syn = divmod(spelling, self.synonyms)
            return f"k{key}.{syn}=v{value}"
        return f"f{token - self._filler_base}"

    def chance_accuracy(self) -> float:
        """``1 / n_values``: the answer is uniform over the values and independent of the query token and position."""
        return 1.0 / self.n_values

    # ------------------------------------------------------------------------------------------------ sampling

    def _stream(self, n, rng):
        total, marked, unmarked, queries, cap = (self.seq_len + 1, self.n_marked, self.n_unmarked, self.n_queries,
                                                 self.capacity)
        syn = lambda *shape: rng.integers(0, self.synonyms, size=shape)  # noqa: E731
        high = self.m if self.m_max is None else self.m_max
        m = rng.integers(self.m, high + 1, size=n)

        keys = distinct(rng, n, self.n_keys, marked)  # column 0: the target's key
        values = rng.integers(0, self.n_values, size=(n, marked))
        target, v = keys[:, 0], values[:, 0]
        d = (v + 1 + rng.integers(0, self.n_values - 1, size=n)) % self.n_values
        room = max(unmarked, 1)  # at least one column, so the gathers below never index an empty array
        other = rng.integers(0, self.n_keys - 1, size=(n, room))
        other += other >= target[:, None]  # unmarked bindings of keys other than the target's
        other_values = rng.integers(0, self.n_values, size=(n, room))
        asked = np.concatenate([distinct(rng, n, marked - 1, queries - 1) + 1, np.zeros((n, 1), np.int64)], axis=1)
        query_syn = syn(n, queries)
        marked_syn = syn(n, marked)
        if self.target_synonym == "query":
            marked_syn[:, 0] = query_syn[:, -1]
        cluster_syn = np.repeat(syn(n, 1), cap, axis=1) if self.cluster == "exact" else syn(n, cap)
        bind = lambda key, s, value: self._binding_base + (key * self.synonyms + s) * self.n_values + value  # noqa

        # the items of a sequence: marked (2 tokens), unmarked, cluster copies or fillers (1 token each)
        slots = marked + unmarked + cap
        order = distinct(rng, n, slots, slots)  # slot -> item, a random order
        is_marked = order < marked
        is_unmarked = (order >= marked) & (order < marked + unmarked)
        c = order - marked - unmarked  # index among the cluster-or-filler items
        is_cluster = (c >= 0) & (c < m[:, None])
        take = lambda table, idx: np.take_along_axis(table, np.clip(idx, 0, table.shape[1] - 1), axis=1)  # noqa
        fillers = self._filler_base + distinct(rng, n, cap, cap)
        token = np.where(is_marked, bind(take(keys, order), take(marked_syn, order), take(values, order)),
                np.where(is_unmarked, bind(take(other, order - marked), syn(n, slots),
                                           take(other_values, order - marked)),
                np.where(is_cluster, bind(target[:, None], take(cluster_syn, c), d[:, None]),
                         take(fillers, c))))
        length = np.where(is_marked, 2, 1)
        start = np.cumsum(length, axis=1) - length
        stream = np.zeros((n, total), dtype=np.int64)
        rows = np.broadcast_to(np.arange(n)[:, None], start.shape)
        stream[rows[is_marked], start[is_marked]] = MARK
        stream[rows, start + is_marked] = token
        first = total - 3 * queries
        stream[:, first::3] = QUERY
        asked_keys = np.take_along_axis(keys, asked, axis=1)
        stream[:, first + 1::3] = 2 + asked_keys * self.synonyms + query_syn
        stream[:, first + 2::3] = self._value_base + np.take_along_axis(values, asked, axis=1)
        answer = np.zeros((n, self.seq_len), dtype=bool)
        answer[:, first + 1::3] = True
        return stream, answer

    def roles(self, x: np.ndarray) -> np.ndarray:
        """int8 [n, T] from the tokens of x: 1 at the target binding (the binding token after a marker whose key is
        the last query's key), 2 at every unmarked binding of that key before the queries (the cluster), 3 at the
        last position (the hijack query). ``(roles == 2).sum(1)`` is each sequence's m."""
        x = np.asarray(x)
        if x.ndim != 2 or x.shape[1] != self.seq_len:
            raise ValueError(f"x must have shape [n, {self.seq_len}], got {list(x.shape)}")
        key = self.binding_key(x)
        binding = (x >= self._binding_base) & (x < self._filler_base)
        after_mark = np.zeros(x.shape, dtype=bool)
        after_mark[:, 1:] = x[:, :-1] == MARK
        hit = binding & (key == key[:, -1:])
        roles = np.zeros(x.shape, dtype=np.int8)
        roles[hit & after_mark] = UNIQUE
        roles[hit & ~after_mark] = CLUSTER
        roles[:, -1] = QUERY_POS
        return roles
