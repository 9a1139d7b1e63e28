"""The shipped comparisons (`attnlab compare --experiment NAME`): well-formed, and the same grids the README's
results were measured with."""

from __future__ import annotations

import pytest

from attnlab.errors import ConfigError
from attnlab.experiments import experiment_names, load_experiment
from attnlab.experiments.compare import spec_dict
from attnlab.presets import load_preset
from attnlab.variants import variant_info


@pytest.mark.parametrize("name", experiment_names())
def test_every_experiment_is_well_formed(name):
    exp = load_experiment(name)
    for v in exp.variants:
        variant_info(v)  # registered
    assert len(set(exp.variants)) == len(exp.variants) and len(exp.seeds) >= 3  # the brief: several seeds
    assert exp.variants[0] == "standard"  # the baseline of the Welch tests
    exp.base_config()  # the overrides are valid settings


def test_boneless_is_the_write_ups_six_steps_on_the_cpu_model():
    exp = load_experiment("boneless")
    assert set(exp.variants) == {"boneless-corr", "boneless-softmax", "boneless-value", "standard", "identity-qk",
                                 "residual-qk"}
    base, cpu = exp.base_config(), load_preset("cpu")
    assert base.model == cpu.model and base.data == cpu.data
    assert base.train.max_steps == 1000 and base.train.replace(max_steps=cpu.train.max_steps) == cpu.train


def test_magnitude_is_issue_4s_grid_on_the_default_preset():
    """The README's magnitude table was measured with `compare --variants standard magnitude-causal
    magnitude-prefix --seeds 0 1 2` on the default preset: `--experiment magnitude` is the same comparison
    (same compare.toml), so it resumes or reproduces that directory."""
    exp = load_experiment("magnitude")
    variants = ["standard", "magnitude-causal", "magnitude-prefix"]
    assert spec_dict(exp.base_config(), exp.variants, exp.seeds) == spec_dict(load_preset("cpu"), variants,
                                                                               [0, 1, 2])


def test_recall_parts_train_every_registered_variant_on_their_task():
    """Issue 15: the recall experiment is every registered variant x each task, split into parts named
    ``recall-<task>`` or ``recall-<task>-<n>`` that fit 90 minutes each. The parts of one task share every setting
    but the variants, each starts with the baseline, and together they train every registered variant."""
    import re

    from attnlab.variants import variants

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


def test_unknown_experiment_is_one_line():
    with pytest.raises(ConfigError, match="unknown experiment 'magnitud' \\(did you mean 'magnitude'\\?\\)"):
        load_experiment("magnitud")
