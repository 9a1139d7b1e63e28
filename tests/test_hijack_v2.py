"""hijack-v2: the documented format read back by an independent parser (helpers.parse_hijack_v2), and the design
argument (a)-(d) checked on the parse, not on the generator's internals."""

from __future__ import annotations

import numpy as np
import pytest

from attnlab.data.task_source import task_name
from attnlab.tasks import HijackV2, get_task
from attnlab.train.hooks import HijackSweepHook
from helpers import one_line_error, parse_hijack_v2 as parse


SIZES = [{}, HijackV2.tiny_params, {"m": 0, "m_max": 8}, {"m": 36}, {"cluster": "exact", "m": 20},
         {"target_synonym": "query", "m": 8}, {"synonyms": 1, "m": 5}, {"n_unmarked": 0, "m": 3},
         {"n_marked": 1, "n_queries": 1, "n_keys": 2, "n_values": 2, "n_unmarked": 2, "seq_len": 8, "m": 1}]


@pytest.mark.parametrize("params", SIZES, ids=range(len(SIZES)))
def test_the_documented_format_parses_and_gives_the_targets(params):
    task = HijackV2(**params)
    x, y = task.sample(200, np.random.default_rng(len(params)))
    assert x.shape == y.shape == (200, task.seq_len) and x.max() < task.vocab_size and x.min() >= 0
    roles = task.roles(x)
    m_drawn = set()
    for row, targets, row_roles in zip(x, y, roles):
        p = parse(task, row)
        assert targets.tolist() == p.expected and targets[-1] == p.answer
        m = len(p.cluster_pos)
        m_drawn.add(m)
        # (b) a true cluster: m unmarked bindings of the target's key, all to one distractor d != v
        assert len(p.cluster_values) == (1 if m else 0) and p.answer - (2 + task.n_keys * task.synonyms) \
            not in p.cluster_values
        if task.cluster == "exact":
            assert len(set(p.cluster_tokens)) == (1 if m else 0)
        if task.target_synonym == "query":
            assert p.target_spelling == p.query_spelling
        # (d) the filler: distinct tokens, and at least one left
        assert len(p.fillers) == len(set(p.fillers)) == task.capacity - m >= 1
        assert len(p.unmarked_keys) == task.n_unmarked
        assert np.flatnonzero(row_roles == 1).tolist() == [p.target_pos]
        assert np.flatnonzero(row_roles == 2).tolist() == p.cluster_pos
        assert np.flatnonzero(row_roles == 3).tolist() == [task.seq_len - 1]
    high = task.m if task.m_max is None else task.m_max
    assert m_drawn <= set(range(task.m, high + 1))


def test_the_example_is_the_docstring_and_token_names_follow_the_layout():
    task = HijackV2.tiny()
    assert task.example() in HijackV2.__doc__.replace("        ", "")
    t = HijackV2(n_keys=3, n_values=5, synonyms=2, n_marked=2, n_queries=1, n_unmarked=1, seq_len=16)
    assert t.vocab_size == 2 + 6 + 5 + 30 + t.capacity and t.capacity == 17 - 4 - 1 - 3
    assert [t.token_name(i) for i in (0, 1, 2, 3, 7, 8, 13, 13 + (2 * 2 + 1) * 5 + 4, 43)] == \
        ["*", "?", "k0.0", "k0.1", "k2.1", "v0", "k0.0=v0", "k2.1=v4", "f0"]
    assert t.binding_key(np.array([0, 1, 2, 5, 8, 13 + 3 * 5 + 2, 43])).tolist() == [-1, -1, 0, 1, -1, 1, -1]


def test_training_defines_the_rule_unmarked_bindings_of_queried_keys_occur_and_never_answer():
    """(a): in a training distribution with n_unmarked > 0, most sequences hold an unmarked binding of some queried
    key with a value other than its marked one, and the target is still the marked value."""
    task = HijackV2(m=0, m_max=8)
    x, y = task.sample(400, np.random.default_rng(3))
    conflicting = 0
    for row in x:
        p = parse(task, row)
        queried = {(int(row[t + 1]) - 2) // task.synonyms for t in range(len(row) + 1 - 3 * task.n_queries,
                                                                        len(row), 3)}
        conflicting += bool(p.cluster_pos) or bool(queried & set(p.unmarked_keys))
    assert conflicting > 0.9 * 400


def test_synonym_clusters_are_mostly_distinct_tokens_and_exact_ones_one_token():
    exact, syn = (HijackV2(m=16, synonyms=8, cluster=c) for c in ("exact", "synonym"))
    xs, _ = syn.sample(100, np.random.default_rng(0))
    xe, _ = exact.sample(100, np.random.default_rng(0))
    distinct_syn = [len(set(parse(syn, r).cluster_tokens)) for r in xs]
    assert all(len(set(parse(exact, r).cluster_tokens)) == 1 for r in xe)
    # 16 copies over 8 spellings drawn uniformly: 8 * (1 - (7/8)^16) = 7.09 distinct on average
    assert abs(np.mean(distinct_syn) - 8 * (1 - (7 / 8) ** 16)) < 0.2


def test_the_sweep_cells():
    task = HijackV2(m=0, m_max=8)
    cells = task.sweep()
    assert list(cells)[:5] == ["exact-m0", "exact-m4", "exact-m8", "exact-m16", "exact-m32"]
    assert {"synonym-m32", "mediocre-m8", "mediocre-m32"} <= set(cells) and "synonym-m0" not in cells
    assert cells["mediocre-m32"].target_synonym == "query" and cells["mediocre-m32"].cluster == "synonym"
    assert all(c.m_max is None for c in cells.values())
    assert "exact-m32" not in HijackV2(seq_len=50).sweep()  # capacity 26: m = 32 leaves no filler
    assert list(HijackV2(synonyms=1).sweep()) == [f"exact-m{m}" for m in (0, 4, 8, 16, 32)]
    assert list(HijackSweepHook(task).cells) == list(cells)
    assert task_name("task:hijack-v2") == "hijack-v2"


@pytest.mark.parametrize("params, fragments", [
    ({"m": 37}, ["data.task.m=37", "0..36", "must leave filler"]),
    ({"m_max": 37}, ["data.task.m_max=37", "0..36"]),
    ({"cluster": "near"}, ["data.task.cluster='near'", "'exact', 'synonym'"]),
    ({"target_synonym": "same"}, ["data.task.target_synonym='same'", "'any', 'query'"]),
    ({"synonyms": 0}, ["data.task.synonyms=0", ">= 1"]),
    ({"n_unmarked": 60}, ["data.task.n_unmarked=60", "leave room for one filler"]),
])
def test_bad_parameters_are_one_line_errors(params, fragments):
    one_line_error(lambda: get_task("hijack-v2", params), *fragments)
