"""The shipped comparisons (`attnlab compare --experiment NAME`): well-formed, and the same grids the README's
results were measured with."""

from __future__ import annotations

import dataclasses
import shutil
import tomllib
from pathlib import Path

import pytest

from attnlab.errors import ConfigError
from attnlab.experiments import experiment_names, load_experiment
from attnlab.experiments.grid import check_or_write_spec, spec_dict
from attnlab.presets import load_preset
from attnlab.registry import variant_info

RESULTS = Path(__file__).resolve().parents[1] / "results"


# The one experiment with a single seed: the hijack experiment asks for one fixed-m run per variant as a check of the mixed-m
# protocol (the comparison itself, hijack-mixed-1/-2, has three).
SINGLE_SEED_CHECKS = {"hijack-fixed"}


@pytest.mark.parametrize("name", experiment_names())
def test_every_experiment_is_well_formed(name):
    exp = load_experiment(name)
    for v in exp.variants:
        variant_info(v)  # registered
    assert len(set(exp.variants)) == len(exp.variants)
    assert len(exp.seeds) >= 3 or (name in SINGLE_SEED_CHECKS and exp.seeds == [0])  # the brief: several seeds
    assert exp.variants[0] == "standard"  # the baseline of the Welch tests
    exp.base_config()  # the overrides are valid settings


def test_boneless_is_the_write_ups_six_steps_on_the_cpu_model():
    exp = load_experiment("boneless")
    assert set(exp.variants) == {"boneless-corr", "boneless-softmax", "boneless-value", "standard", "identity-qk",
                                 "residual-qk"}
    base, cpu = exp.base_config(), load_preset("cpu")
    assert base.model == cpu.model and base.data == cpu.data
    assert base.train.max_steps == 1000 and base.train.replace(max_steps=cpu.train.max_steps) == cpu.train


def test_magnitude_is_the_readme_grid_on_the_default_preset(tmp_path):
    """The README's magnitude table was measured with `compare --variants standard magnitude-causal
    magnitude-prefix --seeds 0 1 2` on the default preset, and seeds 3 and 4 were added with the primary metric
    declared: `--experiment magnitude` is the same comparison (same compare.toml but for those), so it resumes or
    reproduces that directory."""
    exp = load_experiment("magnitude")
    variants = ["standard", "magnitude-causal", "magnitude-prefix"]
    assert exp.primary == "val_loss"
    assert spec_dict(exp.base_config(), exp.variants, exp.seeds) == spec_dict(load_preset("cpu"), variants,
                                                                               [0, 1, 2, 3, 4])
    # the shipped directory resumes under the 5-seed preset (check_or_write_spec raises on any other difference)
    shutil.copy(RESULTS / "magnitude" / "compare.toml", tmp_path / "compare.toml")
    assert check_or_write_spec(tmp_path, spec_dict(exp.base_config(), exp.variants, exp.seeds, exp.primary),
                               type(exp.base_config()))
    assert tomllib.loads((tmp_path / "compare.toml").read_text())["seeds"] == [0, 1, 2, 3, 4]


def test_recall_parts_train_every_registered_variant_on_their_task():
    """The recall experiment is every registered variant x each task, split into parts named
    ``recall-<task>`` or ``recall-<task>-<n>`` that fit 90 minutes each. The parts of one task share every setting
    but the variants, each starts with the baseline, and together they train every registered variant."""
    import re

    from attnlab.registry import variants

    tasks: dict[str, list] = {}
    for name in experiment_names():
        if name.startswith("recall-"):
            task = re.fullmatch(r"recall-(.+?)(-\d+)?", name).group(1)
            tasks.setdefault(task, []).append(load_experiment(name))
    assert "mqar" in tasks
    for task, parts in tasks.items():
        trained = {v for exp in parts for v in exp.variants}
        assert sorted(trained) == sorted(variants()), task
        for exp in parts:
            assert exp.variants[0] == "standard" and exp.seeds == parts[0].seeds
            assert exp.base_config().data.source == "task:" + task
            assert exp.base_config() == parts[0].base_config(), exp.name


def test_dilution_parts_share_the_task_the_stop_rule_and_the_primary_metric():
    """The dilution comparison on mqar (dilution-mqar-<n>): every part trains the same task and model to the same
    stop rule, reads it at the same longer lengths, starts with the baseline, declares the same primary metric, and
    together the parts train the magnitude logit prior, qk-norm, the count prior and every variant of the dilution
    family (the leaderboard's)."""
    from attnlab.experiments.leaderboard import family
    from attnlab.registry import variants

    parts = [load_experiment(n) for n in experiment_names() if n.startswith("dilution-mqar-")]
    assert len(parts) >= 2
    first = parts[0].base_config()
    assert first.data.source == "task:mqar" and first.train.stop_rule is not None
    assert first.train.eval_lengths and min(first.train.eval_lengths) > 32
    for exp in parts:
        assert exp.variants[0] == "standard" and exp.seeds == parts[0].seeds and len(exp.seeds) >= 5
        assert exp.base_config() == first, exp.name
        assert exp.primary == parts[0].primary == f"length/{max(first.train.eval_lengths)}/accuracy"
    trained = {v for exp in parts for v in exp.variants}
    assert {"qk-norm", "count-prior", "magnitude-prefix-logits", "magnitude-prefix-logits-lowrank"} <= trained
    assert {v for v in variants() if family(v) == "dilution"} <= trained


def test_the_dilution_parts_on_noisy_recall_share_the_recall_parts_task_and_model():
    """dilution-noisy-<n>: the recall-noisy-recall parts' task and model, run to a threshold (stop rule, a cap of at
    least the recall parts' budget), 5 seeds, standard first, one primary metric; together the parts train every
    variant of the dilution family beside qk-norm, the count prior and the magnitude logit prior."""
    from attnlab.experiments.leaderboard import family
    from attnlab.registry import variants

    parts = [load_experiment(n) for n in experiment_names() if n.startswith("dilution-noisy-")]
    recall = load_experiment("recall-noisy-recall-1").base_config()
    assert len(parts) >= 2
    for exp in parts:
        cfg = exp.base_config()
        assert cfg.data == recall.data and cfg.model == recall.model, exp.name
        assert cfg.train.stop_rule is not None and cfg.train.max_steps >= recall.train.max_steps
        assert exp.variants[0] == "standard" and len(exp.seeds) >= 5 and exp.primary == parts[0].primary
        assert cfg == parts[0].base_config(), exp.name
    trained = {v for exp in parts for v in exp.variants}
    assert {"qk-norm", "count-prior", "magnitude-prefix-logits"} <= trained
    assert {v for v in variants() if family(v) == "dilution"} <= trained


@pytest.mark.parametrize("name, pos, variant", [("dilution-nope-1", "none", "stick-breaking"),
                                                ("dilution-alibi-mqar", "alibi", "ssmax")])
def test_the_mqar_parts_with_other_positions_differ_from_them_only_in_positions(name, pos, variant):
    """dilution-nope-1 runs stick-breaking in its paper's setting (no positional encoding) against standard and
    qk-norm without positions; dilution-alibi-mqar runs standard, qk-norm and SSMax with ALiBi. Every other setting,
    the seeds and the primary metric are the mqar parts'."""
    mqar, other = load_experiment("dilution-mqar-1"), load_experiment(name)
    assert other.base_config().model.pos_encoding == pos != mqar.base_config().model.pos_encoding
    moved = other.base_config().replace(model=other.base_config().model.replace(pos_encoding="rope"))
    assert moved == mqar.base_config()
    assert other.variants[0] == "standard" and variant in other.variants
    assert other.seeds == mqar.seeds and other.primary == mqar.primary


@pytest.mark.parametrize("name, pos, grid, variant", [("dilution-rope-lm", "rope", "dilution-lm-2", "selective"),
                                                     ("dilution-alibi-lm", "alibi", "dilution-lm-2", "selective"),
                                                     ("dilution-rope-lm-2", "rope", "dilution-lm-4", "stick-breaking"),
                                                     ("dilution-nope-lm", "none", "dilution-lm-4", "stick-breaking")])
def test_the_language_models_positional_controls_differ_from_its_grid_only_in_positions(name, pos, grid, variant):
    """dilution-rope-lm and dilution-alibi-lm run standard and selective with RoPE and with ALiBi, dilution-rope-lm-2
    and dilution-nope-lm standard and stick-breaking with RoPE and without positions; every other setting, the seeds and the primary metric are the dilution-lm
    parts'. The two RoPE parts share standard's runs, so their standard configurations are the same."""
    lm, control = load_experiment(grid), load_experiment(name)
    assert control.base_config().model.pos_encoding == pos != lm.base_config().model.pos_encoding
    moved = control.base_config().replace(model=control.base_config().model.replace(pos_encoding="learned"))
    assert moved == lm.base_config()
    assert control.variants == ["standard", variant] and variant in lm.variants
    assert control.seeds == lm.seeds and control.primary == lm.primary
    if name == "dilution-rope-lm-2":
        assert control.base_config() == load_experiment("dilution-rope-lm").base_config()


HIJACK_VARIANTS = {"standard", "qk-norm", "rbf", "magnitude-causal", "magnitude-prefix", "magnitude-causal-linear",
                   "magnitude-prefix-linear", "magnitude-causal-logits", "magnitude-prefix-logits"}

LOWRANK_ROW = {"standard", "magnitude-causal-lowrank", "magnitude-prefix-logits-lowrank"}


def test_hijack_parts_train_issue_15s_nine_variants_at_m_0_and_sweep_m():
    """The hijack experiment is standard, qk-norm, rbf, the magnitude forms with both gates and the two logits
    variants, 3 seeds, swept over m in {0, 4, 16, 64}. The parts share every setting but the variants, start with
    the baseline, train at m = 0 (the protocol on docs/studies/capability-hijack-v1.md) and leave room for m = 64."""
    from attnlab.tasks import get_task
    from attnlab.tasks.hijack import SWEEP_M

    parts = [load_experiment(n) for n in ("hijack-1", "hijack-2")]
    assert {v for exp in parts for v in exp.variants} == HIJACK_VARIANTS
    for exp in parts:
        base = exp.base_config()
        assert exp.variants[0] == "standard" and exp.seeds == [0, 1, 2] and base == parts[0].base_config()
        task = get_task("hijack", base.data.task)
        assert base.data.source == "task:hijack" and (task.m, task.m_max) == (0, None)
        assert max(SWEEP_M) == 64 <= task.capacity


def test_hijack_with_clusters_in_training_differs_from_hijack_1_only_in_m():
    """The mixed-m protocol (hijack-mixed-1/-2: m drawn per sequence from 0..8, the 9 variants, 3 seeds; -3:
    the low-rank row) and its fixed-m check (hijack-fixed: m = 4, every variant, one seed) change the training clusters and nothing else,
    so their sweeps compare with hijack-1/-2's at the same m."""
    from attnlab.tasks import get_task

    names = [n for n in experiment_names() if n.startswith("hijack-") and not n.startswith("hijack-v2-")]
    assert sorted(names) == ["hijack-1", "hijack-2", "hijack-fixed", "hijack-mixed-1", "hijack-mixed-2",
                             "hijack-mixed-3"]
    reference = load_experiment("hijack-1").base_config()
    mixed = [load_experiment(n) for n in ("hijack-mixed-1", "hijack-mixed-2", "hijack-mixed-3")]
    fixed = load_experiment("hijack-fixed")
    assert {v for exp in mixed[:2] for v in exp.variants} == set(fixed.variants) == HIJACK_VARIANTS
    assert set(mixed[2].variants) == LOWRANK_ROW  # the low-rank row, beside the baseline
    assert [exp.seeds for exp in mixed] == [[0, 1, 2]] * 3 and fixed.seeds == [0]
    for exp, (m, m_max) in [(mixed[0], (0, 8)), (mixed[1], (0, 8)), (mixed[2], (0, 8)), (fixed, (4, None))]:
        base = exp.base_config()
        assert exp.variants[0] == "standard"
        task = get_task("hijack", base.data.task)
        assert (task.m, task.m_max) == (m, m_max)
        assert task.replace(m=0, m_max=None) == get_task("hijack", reference.data.task), exp.name
        without_task = lambda c: c.replace(data=dataclasses.replace(c.data, task={}))
        assert without_task(base) == without_task(reference), exp.name


def test_hijack_v2_parts_declare_their_primary_metric_and_run_to_a_threshold():
    """Every hijack-v2 part trains the same task and model to a stop rule, starts with the baseline, and declares a
    primary metric that its task's sweep logs."""
    from attnlab.tasks import get_task

    parts = [load_experiment(n) for n in experiment_names() if n.startswith("hijack-v2-")]
    assert parts
    for exp in parts:
        base = exp.base_config()
        task = get_task("hijack-v2", base.data.task)
        assert exp.variants[0] == "standard" and len(exp.seeds) >= 5
        assert base.train.stop_rule is not None and base.data.source == "task:hijack-v2"
        cell = exp.primary.removeprefix("hijack/").removesuffix("/accuracy")
        assert cell in task.sweep(), exp.name
    exact = [exp for exp in parts if get_task("hijack-v2", exp.base_config().data.task).synonyms == 1]
    for exp in exact:  # the parts on exact clusters are one comparison split in parts: the same runs but the variants
        assert exp.base_config() == exact[0].base_config() and exp.seeds == exact[0].seeds, exp.name
        assert exp.primary == exact[0].primary


def test_unknown_experiment_is_one_line():
    with pytest.raises(ConfigError, match="unknown experiment 'magnitud' \\(did you mean 'magnitude'\\?\\)"):
        load_experiment("magnitud")


def test_heads_parts_are_one_grid_each_with_the_baseline():
    """The head-recombination variants on the language model (heads-1/-2: the boneless budget on
    the cpu model), on mqar (recall-mqar-4) and on hijack (heads-hijack: hijack-mixed-1's exact settings)."""
    heads = {"talking-heads", "moh", "coda"}
    lm = [load_experiment(n) for n in ("heads-1", "heads-2")]
    assert {v for exp in lm for v in exp.variants} == heads | {"standard"}
    assert lm[0].base_config() == lm[1].base_config() == load_experiment("boneless").base_config().replace(
        out_dir=lm[0].base_config().out_dir)
    assert set(load_experiment("recall-mqar-4").variants) == heads | {"standard"}
    hijack = load_experiment("heads-hijack")
    assert set(hijack.variants) == heads | {"standard"} and hijack.seeds == [0, 1, 2]
    assert hijack.base_config() == load_experiment("hijack-mixed-1").base_config().replace(
        out_dir=hijack.base_config().out_dir)
    for exp in [*lm, hijack]:
        assert exp.variants[0] == "standard"
    assert hijack.seeds == [0, 1, 2]
    for exp in [*lm, load_experiment("boneless")]:  # the language-model parts: 5 seeds, dilution-lm's primary metric
        assert exp.seeds == [0, 1, 2, 3, 4] and exp.primary == "val_loss"
        assert exp.base_config().replace(out_dir="x") == load_experiment("dilution-lm-1").base_config().replace(
            out_dir="x")


def test_the_dilution_parts_on_the_language_model_share_one_grid_and_cover_every_answer():
    """The dilution-lm parts are one grid split by cost: the same base config (the cpu preset for 1000 steps), seeds
    and primary metric, each starting with standard; together they train every variant of the dilution family
    beside qk-norm, the count prior and the magnitude logit prior in its exact and low-rank forms."""
    from attnlab.experiments.leaderboard import family
    from attnlab.registry import variants

    parts = [load_experiment(n) for n in experiment_names() if n.startswith("dilution-lm-")]
    assert len(parts) >= 2
    for exp in parts:
        assert exp.base_config() == parts[0].base_config(), exp.name
        assert exp.base_config().train.max_steps == 1000 and exp.base_config().data == load_experiment(
            "heads-1").base_config().data
        assert exp.variants[0] == "standard" and len(exp.seeds) >= 5 and exp.seeds == parts[0].seeds
        assert exp.primary == "val_loss"
    trained = [v for exp in parts for v in exp.variants[1:]]
    assert len(trained) == len(set(trained)), "a variant is trained in two parts"
    assert {"qk-norm", "count-prior", "magnitude-prefix-logits", "magnitude-prefix-logits-lowrank"} <= set(trained)
    assert {v for v in variants() if family(v) == "dilution"} <= set(trained)


def test_the_gates_reruns_to_a_threshold_reuse_their_baselines_runs():
    """noisy-gates-1/-2 and mqar-gates-1/-2 rerun the four magnitude value gates to a threshold with exactly the
    settings of the dilution part whose standard runs they reuse (copied into the run directory, so compare skips
    them): the same base config, standard first, 5 seeds, a primary metric and a stop rule."""
    gates = {"magnitude-causal", "magnitude-prefix", "magnitude-causal-linear", "magnitude-prefix-linear"}
    for prefix, source in (("noisy-gates", "dilution-noisy-1"), ("mqar-gates", "dilution-mqar-1")):
        base = load_experiment(source)
        parts = [load_experiment(f"{prefix}-{n}") for n in (1, 2)]
        assert {v for p in parts for v in p.variants} == gates | {"standard"}
        for part in parts:
            assert part.base_config() == base.base_config() and part.variants[0] == "standard" == base.variants[0]
            assert part.seeds == base.seeds == [0, 1, 2, 3, 4] and part.primary == "val_accuracy"
            assert part.base_config().train.stop_at == "val_accuracy >= 0.99"


@pytest.mark.parametrize("name,recall", [("induction-gates", "recall-induction"),
                                         ("selective-copy-gates", "recall-selective-copy-1")])
def test_the_gates_on_induction_and_selective_copy_rerun_the_recall_recipe_to_a_threshold(name, recall):
    """The same task and model as the fixed-budget recall part, standard and the four value gates, 5 seeds, run to
    val_accuracy >= 0.99 with a longer cap, the primary metric declared."""
    exp, fixed = load_experiment(name), load_experiment(recall)
    cfg, base = exp.base_config(), fixed.base_config()
    assert cfg.model == base.model and cfg.data == base.data
    assert (cfg.train.batch_size, cfg.train.lr, cfg.train.min_lr) == (base.train.batch_size, base.train.lr,
                                                                       base.train.min_lr)
    assert cfg.train.stop_at == "val_accuracy >= 0.99" and cfg.train.max_steps > base.train.max_steps
    assert exp.variants == ["standard", "magnitude-causal", "magnitude-prefix", "magnitude-causal-linear",
                            "magnitude-prefix-linear"]
    assert exp.seeds == [0, 1, 2, 3, 4] and exp.primary == "val_accuracy"
