"""The task generators: determinism, shapes, the answers checked by parsers written from the
documented formats (not from the generators), hijack's conditions (a)-(c), the chance levels against a simulated
context-free predictor, the one-line errors and the docstring examples.

The parsers below read only the token ids the docstrings document; they never call a generator's internals.
"""

from __future__ import annotations

import ast
import dataclasses
import doctest
import inspect

import numpy as np
import pytest

from attnlab.errors import ConfigError
from attnlab.tasks import TASKS, Hijack, HijackV2, Induction, MQAR, NoisyRecall, SelectiveCopy, get_task, task_names
from attnlab.tasks import base as tasks_base, copying, hijack as hijack_module, hijack_v2 as hijack_v2_module, recall
from helpers import parse_hijack_v2

# small, medium and default sizes of every task (each must generate and parse)
SIZES = {
    "mqar": [{}, MQAR.tiny_params, {"n_pairs": 5, "n_queries": 3, "n_keys": 7, "n_values": 3, "seq_len": 33},
             {"n_pairs": 4, "n_keys": 20, "n_values": 20, "seq_len": 40, "query_power": 0.01},
             {"n_pairs": 5, "n_queries": 2, "n_keys": 9, "n_values": 5, "seq_len": 31, "query_power": 2.0}],
    "induction": [{}, Induction.tiny_params, {"n_symbols": 9, "copy_len": 9, "seq_len": 20}],
    "selective-copy": [{}, SelectiveCopy.tiny_params, {"n_symbols": 2, "n_copy": 10, "seq_len": 20}],
    "noisy-recall": [{}, NoisyRecall.tiny_params, {"n_pairs": 3, "n_keys": 3, "n_noise": 0, "seq_len": 9},
                     {"n_pairs": 6, "n_keys": 12, "n_values": 12, "noise_vocab": 8, "n_noise": 8, "seq_len": 32,
                      "balanced": True},
                     {"n_pairs": 6, "n_keys": 12, "n_values": 12, "noise_vocab": 8, "n_noise": 8, "seq_len": 32,
                      "balanced": True, "bindings_first": True}, {"n_pairs": 3, "seq_len": 20, "n_noise": 4, "bindings_first": True},
                     {"n_pairs": 6, "n_keys": 12, "n_values": 12, "noise_vocab": 8, "n_noise": 9, "seq_len": 32,
                      "aligned_noise": True}, {"n_pairs": 2, "n_noise": 4, "seq_len": 12, "aligned_noise": True},
                     {"n_pairs": 6, "n_keys": 12, "n_values": 12, "noise_vocab": 8, "n_noise": 0, "n_noise_max": 8,
                      "seq_len": 32, "balanced": True, "bindings_first": True}],
    "hijack": [{}, Hijack.tiny_params, {"m": 0, "m_max": 64}, {"m": 65},
               {"n_marked": 1, "n_keys": 2, "n_queries": 1, "seq_len": 6},
               {"n_marked": 3, "n_queries": 1, "m": 1, "m_max": 4, "seq_len": 21},
               {"n_queries": 4, "m": 0, "m_max": 64, "seq_len": 163},
               {"n_marked": 3, "n_queries": 3, "m": 2, "seq_len": 24, "n_keys": 5, "n_values": 5}],
    "hijack-v2": [{}, HijackV2.tiny_params, {"m": 0, "m_max": 8}, {"m": 36, "cluster": "exact"},
                  {"m": 5, "target_synonym": "query", "synonyms": 3}],
}
CASES = [(name, params) for name, sizes in SIZES.items() for params in sizes]
CASE_IDS = [f"{name}-{i}" for name, sizes in SIZES.items() for i in range(len(sizes))]


# ------------------------------------------------------------------------------------------------------ the parsers
# Each returns the targets the documented format implies for one row of x (-1 off the answers), after checking the
# row follows the format. They are written from the docstrings' "Format" paragraphs.


def parse_mqar(task: MQAR, row) -> list[int]:
    """Filler 0, keys 1..n_keys, values above. Bindings ``key value`` first (distinct keys), then queries: a key seen
    before, followed by its value, among fillers. The target after a query key is the value bound to it."""
    row = [int(t) for t in row]
    is_key = lambda t: 1 <= t <= task.n_keys
    bound, expected, t, queries = {}, [-1] * len(row), 0, 0
    while t < len(row) and is_key(row[t]) and row[t] not in bound:  # the bindings
        assert row[t + 1] > task.n_keys, "a binding's key is followed by a value"
        bound[row[t]] = row[t + 1]
        t += 2
    assert len(bound) == task.n_pairs
    asked = set()
    for t in range(t, len(row)):
        if is_key(row[t]):
            assert row[t] in bound and row[t] not in asked, "a query repeats a bound key once"
            asked.add(row[t])
            expected[t] = bound[row[t]]
            queries += 1
        elif row[t] > task.n_keys:
            assert is_key(row[t - 1]) and row[t] == bound[row[t - 1]], "in the query region a value follows its key"
        else:
            assert row[t] == 0
    assert queries == (task.n_pairs if task.n_queries is None else task.n_queries)
    return expected


def parse_induction(task: Induction, row) -> list[int]:
    """Marker 1 at the start and again after the random sequence; the second copy repeats the first. The target is
    read off by induction: the token after the earlier occurrence of the current token."""
    row = [int(t) for t in row]
    markers = [t for t, tok in enumerate(row) if tok == 1]
    assert len(markers) == 2 and markers[0] == 0
    first = row[1:markers[1]]
    assert len(first) == task.copy_len and len(set(first)) == len(first) and min(first) >= 2
    expected = [-1] * len(row)
    for t in range(markers[1], len(row)):
        if row[t] == 0:  # filler after the second copy
            assert t > markers[1] + len(first)
            continue
        earlier = row.index(row[t])  # the first occurrence: tokens are distinct within a copy
        assert earlier < markers[1]
        if earlier + 1 < markers[1]:  # the token after it belongs to the first copy
            expected[t] = row[earlier + 1]
            if t + 1 < len(row):
                assert row[t + 1] == expected[t], "the second copy repeats the first"
    return expected


def parse_selective_copy(task: SelectiveCopy, row) -> list[int]:
    """Blanks 0 and symbols (>= 2) before the copy marker 1; after it, the symbols in their order."""
    row = [int(t) for t in row]
    assert row.count(1) == 1
    marker = row.index(1)
    symbols = [t for t in row[:marker] if t != 0]
    assert len(symbols) == task.n_copy and marker == task.seq_len - task.n_copy
    expected = [-1] * len(row)
    for j, t in enumerate(range(marker, len(row))):
        expected[t] = symbols[j]
        if t + 1 < len(row):
            assert row[t + 1] == symbols[j], "after the marker the inputs are the previous answers"
    return expected


def parse_noisy_recall(task: NoisyRecall, row) -> list[int]:
    """Keys below n_keys, values next, noise above; a key is always followed by its value; a key seen before is an
    answer, its target the value it was bound to at its first occurrence."""
    row = [int(t) for t in row]
    is_key = lambda t: t < task.n_keys
    is_value = lambda t: task.n_keys <= t < task.n_keys + task.n_values
    bound, expected, t = {}, [-1] * len(row), 0
    while t < len(row):
        tok = row[t]
        if is_key(tok):
            if tok in bound:
                expected[t] = bound[tok]
            if t + 1 < len(row):
                assert is_value(row[t + 1]) and bound.setdefault(tok, row[t + 1]) == row[t + 1]
            t += 2
        else:
            assert not is_value(tok), "a value only follows a key"
            t += 1
    assert len(bound) <= task.n_pairs
    return expected


@dataclasses.dataclass
class HijackParse:
    expected: list[int]
    answer: int
    query_key: int
    query_pos: int
    unique_pos: list[int]  # key positions of the marked bindings of the query's key
    cluster_pos: list[int]  # key positions of unmarked bindings of the query's key
    cluster_values: set
    marked_keys: list[int]
    cluster_tokens: list[int]  # the token at each cluster key position (the key, or the fused binding token)


def parse_hijack(task: Hijack, row) -> HijackParse:
    """Filler 0, marker 1, query token 2, keys 3..n_keys+2, values above, then (fused) the binding tokens. Records
    ``* key value`` (marked) and ``key value`` (unmarked), or ``* k=v`` and ``k=v`` when fused, after an optional filler, then queries ``? key value``, the last one ``? key`` cut off
    by the end of x (the hijack query). A query's answer is the value of the marked binding of its key."""
    row = [int(t) for t in row]
    is_key = lambda t: 3 <= t < 3 + task.n_keys
    is_value = lambda t: 3 + task.n_keys <= t < 3 + task.n_keys + task.n_values
    base = 3 + task.n_keys + task.n_values  # fused: binding token k=v is base + k * n_values + v
    first_query = len(row) + 1 - 3 * task.n_queries  # the queries fill the end of the stream
    t = 0 if task.fused else (len(row) + 1 - 3 * task.n_marked - 3 * task.n_queries) % 2  # filler for the parity
    assert row[:t] == [0] * t
    records = []  # (marked, key position, key, value), key and value as the tokens k<a> and v<b>
    while t < first_query:  # the records
        if row[t] == 0 and not task.neutral:
            width = 1 if task.fused else 2
            assert row[t:t + width] == [0] * width, f"a filler record is _ (fused) or _ _, at {t}"
            t += width
            continue
        marked = row[t] == 1
        t += marked
        if task.fused:
            assert base <= row[t] < base + task.n_keys * task.n_values, f"a fused record is [*] k=v, at {t}"
            key, value = divmod(row[t] - base, task.n_values)
            records.append((marked, t, key + 3, value + 3 + task.n_keys))
            t += 1
            continue
        assert is_key(row[t]) and is_value(row[t + 1]), f"a record is [*] key value, at {t}"
        records.append((marked, t, row[t], row[t + 1]))
        t += 2
    expected = [-1] * len(row)
    asked = []
    while t < len(row):  # the queries
        assert row[t] == (1 if task.marked_query else 2) and is_key(row[t + 1]), f"a query is ?|* key [value], at {t}"
        key = row[t + 1]
        marked = [r for r in records if r[0] and r[2] == key]
        assert len(marked) == 1, "(c) exactly one marked binding of a query's key"
        expected[t + 1] = marked[0][3]
        if t + 2 < len(row):
            assert row[t + 2] == marked[0][3], "a query's value (teacher forced) is its answer"
        asked.append(key)
        t += 3
    assert t == len(row) + 1 and len(set(asked)) == len(asked) == task.n_queries, "the last query ends x"
    query_key = row[-1]
    unique = [r for r in records if r[0] and r[2] == query_key]
    cluster = [r for r in records if not r[0] and r[2] == query_key]
    return HijackParse(expected, unique[0][3], query_key, len(row) - 1, [r[1] for r in unique],
                       [r[1] for r in cluster], {r[3] for r in cluster}, [r[2] for r in records if r[0]],
                       [row[r[1]] for r in cluster])


PARSERS = {"mqar": parse_mqar, "induction": parse_induction, "selective-copy": parse_selective_copy,
           "noisy-recall": parse_noisy_recall, "hijack": lambda task, row: parse_hijack(task, row).expected,
           "hijack-v2": lambda task, row: parse_hijack_v2(task, row).expected}


# --------------------------------------------------------------------------------------------------------- registry


def test_registry_order_and_names():
    assert task_names() == ["mqar", "induction", "selective-copy", "noisy-recall", "hijack", "hijack-v2"]
    assert list(TASKS) == task_names()
    for name, cls in TASKS.items():
        assert cls.name == name and isinstance(cls.summary, str) and "\n" not in cls.summary
        task = get_task(name)
        assert isinstance(task, cls) and task == cls()
        assert dataclasses.is_dataclass(task) and task.__dataclass_params__.frozen


def test_get_task_passes_params():
    task = get_task("mqar", {"n_pairs": 4, "seq_len": 32})
    assert (task.n_pairs, task.seq_len, task.n_keys) == (4, 32, MQAR().n_keys)
    assert task.replace(n_pairs=2).n_pairs == 2


# ----------------------------------------------------------------------------------------- determinism and shapes


@pytest.mark.parametrize("name,params", CASES, ids=CASE_IDS)
def test_determinism_shapes_and_range(name, params):
    task = get_task(name, params)
    x, y = task.sample(17, np.random.default_rng(5))
    x2, y2 = task.sample(17, np.random.default_rng(5))
    assert np.array_equal(x, x2) and np.array_equal(y, y2)
    x3, _ = task.sample(17, np.random.default_rng(6))
    assert not np.array_equal(x, x3)
    rng = np.random.default_rng(5)  # two draws from one generator continue the stream: they differ
    assert not np.array_equal(task.sample(17, rng)[0], task.sample(17, rng)[0])
    for a in (x, y):
        assert a.dtype == np.int64 and a.shape == (17, task.seq_len)
    assert x.min() >= 0 and x.max() < task.vocab_size
    assert np.all((y == -1) | ((y >= 0) & (y < task.vocab_size)))
    assert (y >= 0).any(axis=1).all(), "every sequence has an answer"
    empty_x, empty_y = task.sample(0, np.random.default_rng(0))
    assert empty_x.shape == empty_y.shape == (0, task.seq_len)


def test_every_token_of_the_vocabulary_can_occur():
    for name in task_names():
        task = get_task(name, {"m": 0, "m_max": 5} if name == "hijack" else {})
        x, y = task.sample(400, np.random.default_rng(0))
        seen = set(np.unique(x)) | set(np.unique(y[y >= 0]))
        unused = set(range(task.vocab_size)) - seen
        # only hijack's leading filler is absent when the parity needs none (T + 1 - 3 - 3 * n_marked even)
        assert unused <= ({0} if name in ("hijack", "induction") else set()), (name, unused)


# ----------------------------------------------------------------------- the answers, read by independent parsers


@pytest.mark.parametrize("name,params", CASES, ids=CASE_IDS)
def test_targets_are_the_parsed_answers(name, params):
    task = get_task(name, params)
    x, y = task.sample(60, np.random.default_rng(1))
    for row, targets in zip(x, y):
        assert PARSERS[name](task, row) == targets.tolist()


def test_answer_counts():
    x, y = MQAR(n_pairs=5, n_queries=3, seq_len=40).sample(50, np.random.default_rng(0))
    assert ((y >= 0).sum(1) == 3).all()
    task = Induction(copy_len=7, seq_len=30)
    _, y = task.sample(10, np.random.default_rng(0))
    assert ((y >= 0).sum(1) == 7).all()
    _, y = SelectiveCopy(n_copy=5).sample(10, np.random.default_rng(0))
    assert ((y >= 0).sum(1) == 5).all()
    _, y = Hijack(n_queries=1).sample(10, np.random.default_rng(0))
    assert ((y >= 0).sum(1) == 1).all() and (y[:, -1] >= 0).all()
    _, y = Hijack(n_queries=3, seq_len=120).sample(10, np.random.default_rng(0))
    assert ((y >= 0).sum(1) == 3).all() and (y[:, -1] >= 0).all()


def test_mqar_query_distances_vary():
    task = MQAR(n_pairs=8, n_keys=31, n_values=32, seq_len=64)  # 18 filler tokens in the query region
    x, y = task.sample(200, np.random.default_rng(0))
    first_query = (y >= 0).argmax(1)
    assert len(set(first_query.tolist())) > 10 and first_query.min() >= 2 * task.n_pairs


def test_mqar_power_law_slots_follow_the_closed_form():
    """query_power = a: the first binding's query takes slot g with probability p_g = g^(a-1) / sum (slot 1 next
    to the bindings), and the second binding's slot s with sum_{r != s} p_r p_s / (1 - p_r) (drawn without
    replacement). Chi-square over 60,000 sequences against those closed forms: at p > 1e-4 a correct sampler fails
    about once in ten thousand runs, while the uniform placement or a draw with replacement misses by far more."""
    from scipy.stats import chisquare
    task = MQAR(n_pairs=4, n_keys=20, n_values=20, seq_len=40, query_power=0.3)
    region = 2 * task.n_pairs
    slots = (task.seq_len + 1 - region) // 2
    x, y = task.sample(60_000, np.random.default_rng(3))
    w = np.arange(1, slots + 1, dtype=float) ** (0.3 - 1)
    p = w / w.sum()
    second = np.array([sum(p[r] * p[s] / (1 - p[r]) for r in range(slots) if r != s) for s in range(slots)])
    for binding, want in ((0, p), (1, second)):
        key = x[:, 2 * binding]
        at = np.array([region + np.flatnonzero(row[region:] == k)[0] for row, k in zip(x, key)])
        assert ((at - region) % 2 == 0).all() and (y[np.arange(len(x)), at] == x[:, 2 * binding + 1]).all()
        seen = np.bincount((at - region) // 2, minlength=slots)
        assert chisquare(seen, want * len(x)).pvalue > 1e-4, (binding, seen[:5], (want * len(x))[:5])


@pytest.mark.parametrize("bad", [0, -1.0, float("inf"), float("nan"), "0.01", True])
def test_mqar_query_power_must_be_a_positive_number(bad):
    with pytest.raises(ConfigError, match=r"data.task.query_power=.* use a finite number > 0"):
        MQAR(query_power=bad)


# ------------------------------------------------------------------------------------------ hijack: (b) and (c)


@pytest.mark.parametrize("n_queries,seq_len,neutral,packed,marked_query,fused",
                         [(1, 160, True, False, False, False), (4, 163, True, False, False, False),
                          (2, 157, False, False, False, False), (2, 157, False, True, False, False),
                          (6, 169, False, False, True, False), (6, 169, False, True, True, False),
                          (2, 90, True, False, False, True), (6, 97, False, False, False, True),
                          (6, 97, False, True, False, True)])
@pytest.mark.parametrize("m", [0, 4, 16, 64])
def test_hijack_cluster_is_m_copies_of_one_key_and_the_answer_is_determined(m, n_queries, seq_len, neutral, packed,
                                                                         marked_query, fused):
    task = Hijack(m=m, n_queries=n_queries, seq_len=seq_len, neutral=neutral, packed=packed,
                  marked_query=marked_query, fused=fused)
    x, y = task.sample(100, np.random.default_rng(m))
    assert x.shape == (100, seq_len)  # the length does not depend on m
    roles = task.roles(x)
    assert roles.dtype == np.int8 and roles.shape == x.shape
    for row, targets, row_roles in zip(x, y, roles):
        p = parse_hijack(task, row)
        # (c): exactly one marked binding of the query's key (checked in the parser), distinct marked keys, and the
        # target is its value
        assert len(set(p.marked_keys)) == len(p.marked_keys) == task.n_marked
        assert targets.tolist() == p.expected and targets[-1] == p.answer and (targets >= 0).sum() == n_queries
        # (b): exactly m unmarked bindings of that same key (the parser matched the key), all bound to one distractor
        # value, not the answer; unfused, each copy is the key token itself; fused, they are one repeated token
        assert len(p.cluster_pos) == m and len(p.cluster_values) == (1 if m else 0)
        assert p.answer not in p.cluster_values
        if fused:
            assert len(set(p.cluster_tokens)) == (1 if m else 0)
        else:
            assert all(row[i] == row[p.unique_pos[0]] for i in p.cluster_pos)
        # roles agree with the parse
        assert np.flatnonzero(row_roles == 1).tolist() == p.unique_pos
        assert np.flatnonzero(row_roles == 2).tolist() == p.cluster_pos
        assert np.flatnonzero(row_roles == 3).tolist() == [p.query_pos]
        binding = 1 if fused else 2  # tokens of an unmarked binding
        marked_len = binding + 1
        if not neutral:  # the marked bindings and the cluster are the only bindings; filler fills the rest
            first = 3 + task.n_keys if fused else 3  # the tokens that open an unmarked binding: k=v, or a key
            last = task.vocab_size if fused else 3 + task.n_keys
            unmarked = [r for r in range(len(row) - 1) if first <= row[r] < last and (r == 0 or row[r - 1] != 1)]
            if fused:
                unmarked = [r for r in unmarked if row[r] >= 3 + task.n_keys + task.n_values]
            # the cluster copies, and (unfused) the keys of the earlier queries unless those are marked too
            assert len(unmarked) == m + (0 if marked_query or fused else n_queries - 1)
            parity = 0 if fused else (len(row) + 1 - 3 * task.n_marked - 3 * n_queries) % 2
            assert (row == 0).sum() == binding * (task.capacity - m) + parity
        if packed:  # the filler first, then the bindings (marked and cluster), then the queries
            bindings = marked_len * task.n_marked + binding * m
            first_query = len(row) + 1 - 3 * n_queries
            assert (row[:first_query - bindings] == 0).all() and (row[first_query - bindings:first_query] != 0).all()


def test_hijack_fused_tokens_decode_to_key_and_value():
    """The fused vocabulary, from the documented id layout: k=v is 3 + n_keys + n_values + k * n_values + v."""
    task = Hijack(fused=True, n_keys=5, n_values=7, n_marked=3, n_queries=2, seq_len=40)
    assert task.vocab_size == 3 + 5 + 7 + 35
    assert task.token_name(3 + 5 + 7 + 2 * 7 + 6) == "k2=v6"
    assert [task.token_name(t) for t in (0, 1, 2, 3, 8)] == ["_", "*", "?", "k0", "v0"]
    assert task.binding_key(np.array([0, 1, 2, 4, 9, 15 + 7 * 3 + 1])).tolist() == [-1, -1, -1, 4, -1, 6]
    assert task.capacity == 41 - 2 * 3 - 3 * 2


def test_hijack_m_range_is_drawn_per_sequence():
    task = Hijack(m=0, m_max=64)
    x, y = task.sample(4000, np.random.default_rng(0))
    m = (task.roles(x) == 2).sum(1)
    assert m.min() == 0 and m.max() == 64 and len(np.unique(m)) == 65
    assert abs(m.mean() - 32) < 1.0  # uniform on 0..64: mean 32, standard error 0.3
    for row, mi in zip(x[:200], m[:200]):
        assert len(parse_hijack(task, row).cluster_pos) == mi
    fixed = task.at_m(16)
    assert (fixed.m, fixed.m_max) == (16, None)
    assert ((fixed.roles(fixed.sample(50, np.random.default_rng(1))[0]) == 2).sum(1) == 16).all()


def test_hijack_neutral_bindings_do_not_use_the_query_key_and_marked_keys_repeat_unmarked():
    task = Hijack(m=0)
    x, _ = task.sample(300, np.random.default_rng(2))
    repeats = 0
    for row in x:
        p = parse_hijack(task, row)
        assert p.cluster_pos == []  # at m = 0 the query's key occurs only in its marked binding (and the query)
        others = set(p.marked_keys) - {p.query_key}
        unmarked_keys = [int(row[t]) for t in range(len(row) - 2)
                         if 3 <= row[t] < 3 + task.n_keys and (t == 0 or row[t - 1] != 1)]
        repeats += any(k in others for k in unmarked_keys)
    assert repeats > 250, "other marked keys also occur unmarked, so marked-and-repeated is no shortcut"


# ------------------------------------------------------------------------------------------------- chance levels


def _context_free_accuracy(task, n_fit: int, n_eval: int, seed: int) -> tuple[float, float, int]:
    """(accuracy of the best predictor from (position, current token), fitted on one sample and scored on
    another; accuracy of the best constant; answers scored). Simulates a model that ignores the context."""
    V, T = task.vocab_size, task.seq_len
    x, y = task.sample(n_fit, np.random.default_rng(seed))
    keep = y >= 0
    cell = (np.nonzero(keep)[1] * V + x[keep]).astype(np.int64)
    counts = np.zeros((T * V, V), dtype=np.int64)
    np.add.at(counts, (cell, y[keep]), 1)
    constant = int(np.bincount(y[keep], minlength=V).argmax())
    table = np.where(counts.sum(1) > 0, counts.argmax(1), constant)
    x, y = task.sample(n_eval, np.random.default_rng(seed + 1))
    keep = y >= 0
    guess = table[np.nonzero(keep)[1] * V + x[keep]]
    return float((guess == y[keep]).mean()), float((constant == y[keep]).mean()), int(keep.sum())


@pytest.mark.parametrize("name,n", [("mqar", 4000), ("induction", 1500), ("selective-copy", 5000),
                                    ("noisy-recall", 2500), ("hijack", 30000)])
def test_chance_accuracy_matches_a_simulated_context_free_predictor(name, n):
    task = get_task(name)
    chance = task.chance_accuracy()
    best, constant, answers = _context_free_accuracy(task, n, n, seed=11)
    tol = 4.5 * np.sqrt(chance * (1 - chance) / answers)  # 4.5 binomial standard errors of the scored sample
    assert abs(best - chance) < tol, (name, best, chance, tol)
    assert constant < chance + tol


@pytest.mark.parametrize("n_pairs,seq_len,n_noise", [(6, 32, 8), (4, 32, 7), (8, 64, 16)])
def test_noisy_recall_balanced_stream_uses_every_key_equally_often(n_pairs, seq_len, n_noise):
    """balanced=true: counted by the parser, every dictionary key occurs n_stream_pairs // n_pairs times or once
    more; the first occurrences are the unscored ones, so the answers are the pairs minus n_pairs."""
    task = get_task("noisy-recall", {"n_pairs": n_pairs, "n_keys": 2 * n_pairs, "n_values": 2 * n_pairs,
                                     "noise_vocab": 8, "n_noise": n_noise, "seq_len": seq_len, "balanced": True})
    pairs = task.n_stream_pairs
    x, y = task.sample(300, np.random.default_rng(2))
    for row, targets in zip(x, y):
        parse_noisy_recall(task, row)
        counts = np.bincount([int(t) for t in row if t < task.n_keys], minlength=task.n_keys)
        counts = counts[counts > 0]
        assert len(counts) == n_pairs and counts.min() >= pairs // n_pairs and counts.max() - counts.min() <= 1
        assert (targets >= 0).sum() == counts.sum() - n_pairs


@pytest.mark.parametrize("balanced", [True, False])
def test_noisy_recall_bindings_first_binds_every_key_once_then_asks(balanced):
    """bindings_first=true, read by the parser: the first n_pairs keys of each stream are the n_pairs distinct
    dictionary keys, every later pair repeats one of them and is an answer (and only those are); balanced queries
    ask every key n_queries // n_pairs times or once more; noise falls inside the bindings too."""
    task = get_task("noisy-recall", {"n_pairs": 6, "n_keys": 12, "n_values": 12, "noise_vocab": 8, "n_noise": 8,
                                     "seq_len": 32, "balanced": balanced, "bindings_first": True})
    x, y = task.sample(400, np.random.default_rng(4))
    noise_inside = 0
    for row, targets in zip(x, y):
        expected = parse_noisy_recall(task, row)
        assert expected == [int(t) for t in targets]
        keys = [(t, int(tok)) for t, tok in enumerate(row) if tok < task.n_keys]
        first = [k for _, k in keys[:6]]
        assert len(set(first)) == 6 and all(k in first for _, k in keys[6:])
        assert [t for t, _ in keys[6:]] == [t for t, want in enumerate(expected) if want >= 0]
        if balanced:
            counts = np.bincount([k for _, k in keys[6:]], minlength=task.n_keys)[first]
            assert counts.max() - counts.min() <= 1
        noise_inside += any(tok >= task.n_keys + task.n_values for tok in row[:keys[5][0]])
    assert noise_inside > 200  # the noise is not only in the query region


@pytest.mark.parametrize("seq_len,n_noise", [(32, 9), (31, 8), (12, 4)])
def test_noisy_recall_aligned_noise_keeps_every_key_at_an_even_position(seq_len, n_noise):
    """aligned_noise=true (MAD's layout), read by the parser: noise comes in runs of two tokens (one odd token at the
    very end), so every key sits at an even position; the noise count is n_noise (x misses the stream's last
    token, which may be noise)."""
    task = get_task("noisy-recall", {"n_pairs": 2, "n_keys": 4, "n_values": 4, "noise_vocab": 3, "n_noise": n_noise,
                                     "seq_len": seq_len, "aligned_noise": True})
    x, _ = task.sample(200, np.random.default_rng(6))
    for row in x:
        parse_noisy_recall(task, row)
        assert (np.flatnonzero(row < task.n_keys) % 2 == 0).all()
        noise = int((row >= task.n_keys + task.n_values).sum())  # the stream's last token is not in x
        assert noise in (n_noise, n_noise - 1), noise


def test_noisy_recall_draws_each_sequence_s_noise_count_when_n_noise_max_is_set():
    """n_noise_max: counted by the parser, the noise per sequence (x plus the stream's unseen last token, so count
    x's and allow one more) follows n_noise..n_noise_max drawn uniformly, and every row parses."""
    task = get_task("noisy-recall", {"n_pairs": 6, "n_keys": 12, "n_values": 12, "noise_vocab": 8, "n_noise": 2,
                                     "n_noise_max": 7, "seq_len": 32, "balanced": True, "bindings_first": True})
    x, _ = task.sample(3000, np.random.default_rng(8))
    noise = (x >= task.n_keys + task.n_values).sum(1)
    for row in x[:300]:
        parse_noisy_recall(task, row)
    # levels 2..7 give the stream 3, 3, 5, 5, 7, 7 noise tokens (33 tokens: an odd count); x may miss the last one
    in_stream = {lvl: 33 - 2 * ((33 - lvl) // 2) for lvl in range(2, 8)}
    assert set(noise) <= {v - d for v in in_stream.values() for d in (0, 1)}
    share = {v: np.isin(noise, [v, v - 1]).mean() for v in (3, 5, 7)}
    assert all(abs(f - 1 / 3) < 0.04 for f in share.values()), share  # 4.5 binomial standard errors of 3000
    fixed, _ = task.replace(n_noise_max=None).sample(500, np.random.default_rng(8))
    assert set((fixed >= task.n_keys + task.n_values).sum(1)) <= {1, 2, 3}


def _most_frequent_value_accuracy(task: NoisyRecall, n: int, seed: int) -> tuple[float, float]:
    """(accuracy, its standard error) of the predictor that answers, at each answer position, the value token seen
    most often so far in the sequence (ties to the smallest id), with the answers found by the independent parser.
    The answers of one sequence are correlated, so the standard error is taken over sequences (a ratio estimate)."""
    x, _ = task.sample(n, np.random.default_rng(seed))
    is_value = (x >= task.n_keys) & (x < task.n_keys + task.n_values)
    right, total = np.zeros(n), np.zeros(n)
    for i, (row, values) in enumerate(zip(x, is_value)):
        counts = np.cumsum(np.eye(task.vocab_size, dtype=np.int64)[row] * values[:, None], axis=0)
        for t, want in enumerate(parse_noisy_recall(task, row)):
            if want >= 0:
                right[i] += counts[t].argmax() == want
                total[i] += 1
    accuracy = right.sum() / total.sum()
    return accuracy, float(np.std(right - accuracy * total) / np.sqrt(n) / total.mean())


@pytest.mark.parametrize("n_pairs,n_keys,balanced,plateau", [(4, 8, False, 0.451), (6, 12, False, 0.366),
                                                              (4, 8, True, 0.334), (6, 12, True, 0.242)])
def test_noisy_recall_plateau_is_the_most_frequent_value_in_context(n_pairs, n_keys, balanced, plateau):
    """docs/tasks.md#status: the noisy-recall plateau (44-46% with 4 pairs, 34% with 6, at T = 32 with 8 noise
    tokens) is what answering the most frequent value seen so far scores, 45.1% and 36.6% (measured on 20,000
    sequences): a key repeats with its value, so the queried key's value is often the commonest. A balanced stream
    lowers the rule to 33.4% and 24.2%. Tolerance: 4.5 standard errors over 3,000 sequences (about 0.018)."""
    task = get_task("noisy-recall", {"n_pairs": n_pairs, "n_keys": n_keys, "n_values": n_keys, "noise_vocab": 8,
                                     "n_noise": 8, "seq_len": 32, "balanced": balanced})
    accuracy, se = _most_frequent_value_accuracy(task, 3000, seed=5)
    assert abs(accuracy - plateau) < 4.5 * se, (accuracy, se)
    assert accuracy > (2 if balanced else 3) * task.chance_accuracy()  # well above chance either way


def test_chance_accuracy_formulas():
    assert MQAR(n_values=10).chance_accuracy() == 0.1
    assert NoisyRecall(n_values=8).chance_accuracy() == 0.125
    assert SelectiveCopy(n_symbols=5).chance_accuracy() == 0.2
    assert Hijack(n_values=16).chance_accuracy() == 1 / 16
    # induction by enumeration: the first answer is one of n symbols, each later one of the n - 1 not showing
    task = Induction(n_symbols=5, copy_len=3, seq_len=9)
    assert task.chance_accuracy() == pytest.approx((1 / 5 + 1 / 4 + 1 / 4) / 3)


# -------------------------------------------------------------------------------------------------- bad parameters


BAD = [
    ("mqr", {}, "unknown task 'mqr' (did you mean 'mqar'?); valid: "),
    ("mqar", {"n_pair": 3}, "unknown mqar parameter 'n_pair' (did you mean 'n_pairs'?); valid: "),
    ("mqar", {"n_pairs": 17, "n_keys": 31, "seq_len": 64}, "data.task.n_pairs=17 is out of range; allowed 1..16"),
    ("mqar", {"n_pairs": 0, "n_keys": 31, "seq_len": 64}, "data.task.n_pairs=0 is out of range; allowed 1..16"),
    ("mqar", {"n_pairs": 8, "n_keys": 4}, "data.task.n_pairs=8 is out of range; allowed 1..4"),
    ("mqar", {"n_queries": 9, "n_pairs": 8, "n_keys": 31, "seq_len": 64}, "data.task.n_queries=9 is out of range; allowed 1..8"),
    ("mqar", {"n_pairs": 30, "n_queries": 3, "n_keys": 31, "seq_len": 64}, "data.task.n_queries=3 is out of range; allowed 1..2"),
    ("mqar", {"n_values": 1}, "data.task.n_values=1 is out of range; allowed >= 2"),
    ("mqar", {"seq_len": "64"}, "data.task.seq_len='64' must be an integer"),
    ("mqar", {"n_pairs": 2.0}, "data.task.n_pairs=2.0 must be an integer"),
    ("induction", {"copy_len": 32}, "data.task.copy_len=32 is out of range; allowed 1..31"),
    ("induction", {"n_symbols": 10}, "data.task.copy_len=31 is out of range; allowed 1..10"),
    ("selective-copy", {"n_copy": 33}, "data.task.n_copy=33 is out of range; allowed 1..32"),
    ("selective-copy", {"n_symbols": 1}, "data.task.n_symbols=1 is out of range; allowed >= 2"),
    ("noisy-recall", {"n_noise": 48}, "data.task.n_noise=48 is out of range; allowed 0..47"),
    ("noisy-recall", {"n_pairs": 17}, "data.task.n_pairs=17 is out of range; allowed 1..16"),
    ("hijack", {"m": 66}, "data.task.m=66 is out of range; allowed 0..65 (capacity = "),
    ("hijack", {"m": -1}, "data.task.m=-1 is out of range; allowed 0..65"),
    ("hijack", {"m_max": 100}, "data.task.m_max=100 is out of range; allowed 0..65"),
    ("hijack", {"m": 10, "m_max": 4}, "data.task.m_max=4 is out of range; allowed 10..65"),
    ("hijack", {"m": 64, "seq_len": 120}, "data.task.m=64 is out of range; allowed 0..45"),
    ("hijack", {"m": True}, "data.task.m=True must be an integer"),
    ("hijack", {"packed": True}, "hijack: packed=true needs neutral=false"),
    ("hijack", {"packed": 1, "neutral": False}, "hijack: packed=1 is not allowed; choose true or false"),
    ("noisy-recall", {"balanced": "yes"}, "noisy-recall: balanced='yes' is not allowed; choose true or false"),
    ("noisy-recall", {"bindings_first": 1}, "noisy-recall: bindings_first=1 is not allowed; choose true or false"),
    ("noisy-recall", {"n_noise": 4, "n_noise_max": 3}, "data.task.n_noise_max=3 is out of range; allowed 4..47"),
    ("noisy-recall", {"aligned_noise": "no"}, "noisy-recall: aligned_noise='no' is not allowed; choose true or false"),
    ("hijack", {"n_marked": 0}, "data.task.n_marked=0 is out of range; allowed 1..32"),
    ("hijack", {"n_keys": 1}, "data.task.n_keys=1 is out of range; allowed >= 2"),
    ("hijack", {"n_queries": 9}, "data.task.n_queries=9 is out of range; allowed 1..8"),
    ("hijack", {"n_queries": 4, "m": 65}, "data.task.m=65 is out of range; allowed 0..62"),
]


@pytest.mark.parametrize("name,params,message", BAD, ids=[f"{b[0]}-{'-'.join(b[1])}" for b in BAD])
def test_bad_parameters_give_one_line_naming_the_range(name, params, message):
    with pytest.raises(ConfigError) as err:
        get_task(name, params)
    text = str(err.value)
    assert "\n" not in text and text.startswith(message), text


def test_direct_construction_checks_too():
    with pytest.raises(ConfigError, match="did you mean 'n_pairs'"):
        MQAR(n_pair=3)
    with pytest.raises(ConfigError, match=r"data.task.m=70 is out of range; allowed 0..65"):
        Hijack().replace(m=70)


def test_sample_rejects_a_bad_rng_or_n():
    with pytest.raises(TypeError):
        MQAR().sample(2, 0)
    with pytest.raises(ValueError):
        MQAR().sample(-1, np.random.default_rng(0))


# ------------------------------------------------------------------------------------------- docstrings and examples


@pytest.mark.parametrize("module", [recall, copying, hijack_module, hijack_v2_module], ids=lambda m: m.__name__)
def test_docstring_examples_equal_example(module):
    result = doctest.testmod(module, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0 and result.attempted >= 1


@pytest.mark.parametrize("name", list(TASKS))
def test_docstring_states_format_source_chance_and_example(name):
    cls = TASKS[name]
    doc = inspect.getdoc(cls)
    assert "Format." in doc and "Chance" in doc and f">>> print({cls.__name__}.tiny().example())" in doc
    source = {"mqar": "arXiv:2312.04927", "selective-copy": "arXiv:2403.17844", "noisy-recall": "arXiv:2403.17844",
              "induction": "arXiv:2209.11895", "hijack": "the magnitude write-up (docs/sources.md#magnitude-attention)",
              "hijack-v2": "the magnitude write-up (docs/sources.md#magnitude-attention)"}[name]
    assert source in doc
    example = cls.tiny().example()
    assert example in doc.replace("\n    ", "\n")  # the printed block, de-indented inside the docstring
    lines = example.split("\n")
    assert lines[0].startswith(f"{name}(") and f"chance {cls.tiny().chance_accuracy():.4f}" in lines[0]
    assert lines[1].startswith("x ") and lines[2].startswith("y ")
    assert cls().example(rng_seed=3) != cls().example(rng_seed=4)


def test_hijack_docstring_gives_the_design_argument():
    doc = inspect.getdoc(Hijack)
    for part in ("(a) At m = 0", "(b) The m cluster copies", "(c) The answer is always determined", "log m"):
        assert part in doc


@pytest.mark.parametrize("name", list(TASKS))
def test_every_parameter_has_a_default_and_an_attribute_docstring(name):
    cls = TASKS[name]
    tree = ast.parse(inspect.getsource(cls))
    body = next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)).body
    documented = {stmt.target.id for stmt, after in zip(body, body[1:])
                  if isinstance(stmt, ast.AnnAssign) and isinstance(after, ast.Expr)
                  and isinstance(after.value, ast.Constant) and isinstance(after.value.value, str)}
    for field in dataclasses.fields(cls):
        assert field.default is not dataclasses.MISSING, field.name
        assert field.name in documented, f"{name}.{field.name} has no attribute docstring"


def test_tasks_import_nothing_but_numpy_and_errors():
    for module in (tasks_base, recall, copying, hijack_module, hijack_v2_module):
        tree = ast.parse(inspect.getsource(module))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level:
                assert node.module in ("errors", "base", "hijack") and node.level in (1, 2), node.module
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module]
                assert all(n.split(".")[0] in ("numpy", "dataclasses", "typing", "__future__") for n in names), names


# ------------------------------------------------------------------------------- hijack (a): attention solves m = 0

HIJACK_A = {"n_marked": 4, "n_queries": 2, "n_keys": 8, "n_values": 8, "m": 0, "seq_len": 23}
HIJACK_A_STEPS = 3000


@pytest.mark.slow
def test_hijack_at_m0_is_learned_by_standard_attention():
    """(a): a 2-layer, 64-wide attnlab GPT with standard attention, trained with a plain torch loop on hijack at
    m = 0, answers the hijack query (the role-3 position) correctly. Slow: recall is learned only after a long
    plateau (see the Hijack docstring), so this takes minutes on one CPU thread."""
    import torch

    import attnlab

    torch.set_num_threads(1)
    torch.manual_seed(0)
    task = Hijack(**HIJACK_A)
    model = attnlab.GPT(attnlab.GPTConfig(vocab_size=task.vocab_size, block_size=task.seq_len, n_layer=2,
                                          n_head=2, n_embd=64))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)
    rng = np.random.default_rng(0)
    for _ in range(HIJACK_A_STEPS):
        x, y = task.sample(128, rng)
        _, loss = model(torch.from_numpy(x), torch.from_numpy(y))
        opt.zero_grad()
        loss.backward()
        opt.step()
    x, y = task.sample(2000, np.random.default_rng(123))
    with torch.no_grad():
        guess = model(torch.from_numpy(x))[0].argmax(-1).numpy()
    hijack_query = task.roles(x) == 3
    answers = y >= 0
    assert (guess[hijack_query] == y[hijack_query]).mean() > 0.9
    assert (guess[answers] == y[answers]).mean() > 0.9
