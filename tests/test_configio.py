"""attnlab.configio (dicts, TOML, overrides), attnlab.train.config and the shipped presets."""

from __future__ import annotations

import dataclasses
import importlib
import os
from dataclasses import dataclass, field

import pytest

from attnlab.config import AttentionConfig
from attnlab.configio import apply_overrides, from_dict, load_config, load_toml, save_toml, to_dict
from attnlab.errors import ConfigError


def _has(module: str, attr: str) -> bool:
    try:
        return hasattr(importlib.import_module(module), attr)
    except ImportError:
        return False


HAVE_DATA = _has("attnlab.data", "DataConfig")
HAVE_VARIANTS = _has("attnlab.registry", "get_variant")
needs_run = pytest.mark.skipif(
    not (HAVE_DATA and HAVE_VARIANTS), reason="attnlab.data.DataConfig / attnlab.registry not available yet"
)
needs_variants = pytest.mark.skipif(not HAVE_VARIANTS, reason="attnlab.registry not available yet")

PRESETS = ("tiny", "cpu", "gpt2-small")


def one_line_error(excinfo) -> str:
    msg = str(excinfo.value)
    assert "\n" not in msg, msg
    assert type(excinfo.value) is ConfigError
    return msg


# --------------------------------------------------------------------------- generic machinery on toy dataclasses


@dataclass(frozen=True)
class Inner:
    rate: float = 0.5
    name: str | None = None


@dataclass(frozen=True)
class Outer:
    count: int = 1
    flag: bool = False
    inner: Inner = field(default_factory=Inner)
    either: str | Inner = "plain"
    sizes: tuple[int, ...] = (1, 2)


def test_generic_round_trip_and_none_dropped():
    cfg = Outer(count=3, flag=True, inner=Inner(rate=2.0), either=Inner(name="x"), sizes=(4,))
    d = to_dict(cfg)
    assert d == {"count": 3, "flag": True, "inner": {"rate": 2.0}, "either": {"rate": 0.5, "name": "x"},
                 "sizes": [4]}
    assert from_dict(Outer, d) == cfg
    assert to_dict(Outer())["either"] == "plain"  # a string member of a union stays a string


def test_generic_from_dict_types():
    got = from_dict(Outer, {"inner": {"rate": 2}, "either": {"name": "n"}})
    assert got.inner.rate == 2.0 and isinstance(got.inner.rate, float)  # int accepted for float
    assert got.either == Inner(name="n")  # a table picks the dataclass member of the union
    for bad, key in [
        ({"count": "3"}, "count='3'"),
        ({"count": 3.0}, "count=3.0"),
        ({"count": True}, "count=True"),
        ({"flag": 1}, "flag=1"),
        ({"inner": {"rate": "fast"}}, "inner.rate='fast'"),
        ({"inner": 3}, "inner=3"),
        ({"either": 3}, "either=3"),
        ({"sizes": [1, "x"]}, "sizes[1]='x'"),
    ]:
        with pytest.raises(ConfigError) as e:
            from_dict(Outer, bad)
        assert key in one_line_error(e), (bad, str(e.value))
        assert "expected" in str(e.value)


def test_generic_unknown_key_names_dotted_path():
    with pytest.raises(ConfigError) as e:
        from_dict(Outer, {"inner": {"rtae": 1.0}})
    msg = one_line_error(e)
    assert "inner.rtae" in msg and "did you mean 'inner.rate'" in msg


# ------------------------------------------------------------------------------------------------------ TOML files


def test_load_toml_missing_file(tmp_path):
    path = tmp_path / "nope.toml"
    with pytest.raises(ConfigError) as e:
        load_toml(path)
    assert str(path) in one_line_error(e) and "not found" in str(e.value)


def test_load_toml_syntax_error_names_file_and_line(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text("[train]\nlr = 1e-3\nbatch_size = = 3\n")
    with pytest.raises(ConfigError) as e:
        load_toml(path)
    msg = one_line_error(e)
    assert str(path) in msg and "line 3" in msg


def test_save_toml_is_atomic_and_overwrites(tmp_path):
    path = tmp_path / "sub" / "cfg.toml"
    save_toml({"a": 1, "b": None, "t": {"x": "y"}}, path)
    assert load_toml(path) == {"a": 1, "t": {"x": "y"}}
    save_toml(Outer(count=7), path)
    assert from_dict(Outer, load_toml(path)) == Outer(count=7)
    assert os.listdir(path.parent) == ["cfg.toml"]  # no temp file left behind


def test_generic_overrides():
    cfg = apply_overrides(Outer(), ["count=4", "inner.rate=3e-4", "flag=true", "inner.name=hello world"])
    assert cfg == Outer(count=4, flag=True, inner=Inner(rate=3e-4, name="hello world"))
    assert apply_overrides(cfg, ["inner.name=none"]).inner.name is None
    assert apply_overrides(cfg, ['inner.name="none"']).inner.name == "none"  # quoted: the string
    assert apply_overrides(cfg, ["inner.name=42"]).inner.name == "42"  # a str field keeps the bare text
    with pytest.raises(ConfigError) as e:
        apply_overrides(cfg, ["count=none"])  # count is not optional: "none" is a (bad) string
    assert "count='none'" in one_line_error(e)
    with pytest.raises(ConfigError) as e:
        apply_overrides(cfg, ["count.x=1"])
    assert "count" in one_line_error(e)


# ------------------------------------------------------------------------------------------ RunConfig and presets


@pytest.fixture(scope="module")
def presets():
    if not (HAVE_DATA and HAVE_VARIANTS):
        pytest.skip("attnlab.data.DataConfig / attnlab.registry not available yet")
    from attnlab.presets import load_preset

    return {name: load_preset(name) for name in PRESETS}


@needs_run
def test_preset_names_and_unknown_preset():
    from attnlab.presets import load_preset, preset_names

    assert set(PRESETS) <= set(preset_names())
    with pytest.raises(ConfigError) as e:
        load_preset("cpuu")
    msg = one_line_error(e)
    assert "did you mean 'cpu'" in msg and all(name in msg for name in PRESETS)


@needs_run
@pytest.mark.parametrize("name", PRESETS)
def test_preset_round_trip_through_toml(presets, name, tmp_path):
    from attnlab.train.config import RunConfig

    cfg = presets[name]
    assert cfg.preset == name
    path = save_toml(cfg, tmp_path / f"{name}.toml")
    data = load_toml(path)
    assert set(data) >= {"model", "data", "train"}
    assert from_dict(RunConfig, data) == cfg
    assert load_config(RunConfig, path) == cfg
    assert RunConfig.from_dict(cfg.to_dict()) == cfg


@needs_run
def test_preset_contents(presets):
    tiny, cpu, big = presets["tiny"], presets["cpu"], presets["gpt2-small"]
    assert (tiny.model.n_layer, tiny.model.n_embd, tiny.train.max_steps) == (2, 32, 30)
    assert tiny.train.eval_tokens <= 4096
    assert cpu.data.tokenizer == "char" and cpu.train.device == "cpu"
    assert (big.model.n_layer, big.model.n_head, big.model.n_embd, big.model.block_size) == (12, 12, 768, 1024)
    assert big.data.tokenizer == "bpe" and big.train.lr == 6e-4


@needs_run
def test_attention_table_round_trip(presets, tmp_path):
    from attnlab.train.config import RunConfig

    cfg = presets["tiny"].replace(model=presets["tiny"].model.replace(attention=AttentionConfig(kernel="rbf")))
    data = load_toml(save_toml(cfg, tmp_path / "a.toml"))
    attn = AttentionConfig(kernel="rbf")
    set_fields = {f.name: getattr(attn, f.name) for f in dataclasses.fields(attn) if getattr(attn, f.name) is not None}
    for table in ("heads", "projections"):  # nested tables, written as tables
        sub = getattr(attn, table)
        set_fields[table] = {f.name: getattr(sub, f.name) for f in dataclasses.fields(sub)
                             if getattr(sub, f.name) is not None}
    assert data["model"]["attention"] == set_fields  # every set field written, unset (None) ones left out
    assert "n_head" not in data["model"]["attention"] and data["model"]["attention"]["kernel"] == "rbf"
    assert from_dict(RunConfig, data) == cfg


def _diff(a, b) -> dict:
    """{dotted key: (old, new)} between two RunConfigs."""
    out = {}

    def walk(x, y, where):
        for key in set(x) | set(y):
            path = f"{where}.{key}" if where else key
            if isinstance(x.get(key), dict) and isinstance(y.get(key), dict):
                walk(x[key], y[key], path)
            elif x.get(key) != y.get(key):
                out[path] = (x.get(key), y.get(key))

    walk(to_dict(a), to_dict(b), "")
    return out


@needs_run
def test_overrides_change_exactly_the_named_fields(presets):
    base = presets["tiny"]
    cfg = apply_overrides(base, [
        "model.n_layer=4", "train.lr=3e-4", "train.compile=true", "data.source=/tmp/x.txt",
        "model.attention=gqa", 'out_dir="runs/my run"', "train.grad_clip=0", "model.pos_encoding=none",
    ])
    assert _diff(base, cfg) == {
        "model.n_layer": (2, 4), "train.lr": (3e-3, 3e-4), "train.compile": (False, True),
        "data.source": ("shakespeare", "/tmp/x.txt"), "model.attention": ("standard", "gqa"),
        "out_dir": (None, "runs/my run"), "train.grad_clip": (1.0, 0.0),
        "model.pos_encoding": ("learned", "none"),
    }
    assert type(cfg.model.n_layer) is int and type(cfg.train.lr) is float and cfg.train.compile is True
    assert type(cfg.train.grad_clip) is float
    assert apply_overrides(cfg, ["out_dir=null"]).out_dir is None
    assert apply_overrides(base, []) is base


@needs_run
def test_overrides_validate_once_at_the_end(presets):
    cfg = apply_overrides(presets["cpu"], ["train.max_steps=10", "train.warmup_steps=2"])
    assert (cfg.train.max_steps, cfg.train.warmup_steps) == (10, 2)


@needs_variants
@needs_run
def test_attention_subfield_override_starts_from_the_variant(presets):
    from attnlab.registry import get_variant

    base = presets["tiny"].replace(model=presets["tiny"].model.replace(attention="gqa"))
    cfg = apply_overrides(base, ["model.attention.temperature=2"])
    attn = cfg.model.attention
    assert isinstance(attn, AttentionConfig) and attn.temperature == 2.0 and type(attn.temperature) is float
    assert attn == get_variant("gqa").replace(temperature=2.0)
    cfg = apply_overrides(presets["tiny"], ["model.attention.temperature=2"])
    assert cfg.model.attention == get_variant("standard").replace(temperature=2.0)
    cfg2 = apply_overrides(cfg, ["model.attention.kernel=rbf"])  # already a table: edits it
    assert cfg2.model.attention == get_variant("standard").replace(temperature=2.0, kernel="rbf")



def test_a_table_after_its_own_sub_keys_is_an_error_not_a_silent_reset(presets):
    """model.attention=gqa after model.attention.ssmax=true would replace the table and drop ssmax: one line says so;
    the other order composes."""
    from attnlab.registry import get_variant

    with pytest.raises(ConfigError, match=r"replaces all of model.attention, so the earlier model.attention.ssmax") as e:
        apply_overrides(presets["tiny"], ["model.attention.ssmax=true", "train.lr=1e-3", "model.attention=gqa"])
    assert "\n" not in str(e.value)
    cfg = apply_overrides(presets["tiny"], ["model.attention=gqa", "model.attention.ssmax=true"])
    assert cfg.model.attention == get_variant("gqa").replace(ssmax=True)

@needs_run
@pytest.mark.parametrize("override, expected", [
    ("train.lrr=1", ["train.lrr", "did you mean 'train.lr'"]),
    ("trian.lr=1", ["trian", "did you mean 'train'"]),
    ("model.attention.temprature=2", ["model.attention.temprature", "did you mean 'model.attention.temperature'"]),
    ("model.n_layer=abc", ["model.n_layer='abc'", "an integer"]),
    ("model.n_layer=2.5", ["model.n_layer=2.5", "an integer"]),
    ("train.compile=3", ["train.compile=3", "true or false"]),
    ("train.lr=fast", ["train.lr='fast'", "a number"]),
    ("model.attention=3", ["unknown attention variant '3'"]),  # a bare string for a string field
    ("train.lr=-1", ["train.lr=-1", "> 0"]),
    ("train.dtype=fp8", ["train.dtype='fp8'", "'bfloat16'"]),
    ("train.device=tpu", ["train.device='tpu'", "'cuda'"]),
    ("train.min_lr=0.1", ["train.min_lr=0.1", "train.lr"]),
    ("train.warmup_steps=-1", ["train.warmup_steps=-1", ">= 0"]),  # (a warmup longer than the run is cut to it)
    ("train.decay_steps=0", ["train.decay_steps=0", ">= 1"]),
    ("train.decay_steps=3", ["train.decay_steps=3", "train.warmup_steps=5"]),  # tiny's warmup is 5 steps
    ("train.decay_steps=x", ["train.decay_steps='x'", "an integer"]),
    ("train.beta2=1", ["train.beta2", "< 1"]),
    ("model.n_layer=0", ["n_layer=0", ">= 1"]),
    ("model.attention=nosuch", ["nosuch", "standard"]),
    ("train.lr", ["train.lr", "KEY=VALUE"]),
    ("=3", ["'=3'"]),
])
def test_bad_overrides_give_one_line_errors(presets, override, expected):
    with pytest.raises(ConfigError) as e:
        apply_overrides(presets["tiny"], [override])
    msg = one_line_error(e)
    for text in expected:
        assert text in msg, msg


@needs_run
def test_bad_toml_contents(tmp_path):
    from attnlab.train.config import RunConfig

    path = tmp_path / "run.toml"
    path.write_text("[train]\nlrr = 1e-3\n")
    with pytest.raises(ConfigError) as e:
        load_config(RunConfig, path)
    msg = one_line_error(e)
    assert str(path) in msg and "train.lrr" in msg and "'train.lr'" in msg
    path.write_text("[model]\nn_layer = '4'\n")
    with pytest.raises(ConfigError) as e:
        load_config(RunConfig, path)
    assert "model.n_layer='4'" in one_line_error(e)
    path.write_text("[model]\nattention = 3\n")
    with pytest.raises(ConfigError) as e:
        load_config(RunConfig, path)
    assert "model.attention=3" in one_line_error(e) and "a string or a table" in str(e.value)
    path.write_text("[modle]\n")
    with pytest.raises(ConfigError) as e:
        load_config(RunConfig, path)
    assert "did you mean 'model'" in one_line_error(e)


@needs_run
def test_train_and_run_config_direct():
    from attnlab.train.config import RunConfig, TrainConfig

    with pytest.raises(ConfigError) as e:
        TrainConfig(lrr=1.0)
    assert "did you mean 'lr'" in one_line_error(e)
    with pytest.raises(ConfigError):
        TrainConfig(compile=1)
    run = RunConfig(train={"max_steps": 5, "warmup_steps": 1}, out_dir="x")
    assert run.train == TrainConfig(max_steps=5, warmup_steps=1) and run.resolved_out_dir() == "x"
    assert RunConfig(model={"n_layer": 1}).resolved_out_dir(0).endswith("-standard")
    assert dataclasses.is_dataclass(run) and run.__dataclass_params__.frozen


def test_a_shipped_run_written_with_flat_attention_keys_still_loads():
    """results/magnitude-lowrank/keys-lowrank/config.toml was written before the magnitude, head and projection
    switches became tables (magnitude = "causal", magnitude_solver = "lowrank", q_mode = ..., flat): the migration
    folds them into today's tables, the same config as the nested form."""
    from pathlib import Path

    from attnlab import HeadMixConfig, MagnitudeConfig, ProjectionConfig
    from attnlab.train.config import RunConfig

    path = Path(__file__).resolve().parents[1] / "results" / "magnitude-lowrank" / "keys-lowrank" / "config.toml"
    data = load_toml(path)
    assert data["model"]["attention"]["magnitude_solver"] == "lowrank" and "q_mode" in data["model"]["attention"]
    attn = from_dict(RunConfig, data).model.resolved_attention()
    assert attn.magnitude == MagnitudeConfig("causal", solver="lowrank", rank=32)
    assert attn.heads == HeadMixConfig() and attn.projections == ProjectionConfig()
