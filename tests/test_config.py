"""Config mistakes give one clear line naming the bad value and what is allowed."""

import pytest

from attnlab import AttentionConfig, GPTConfig, get_variant, variant_info, variants
from helpers import one_line_error


def test_n_embd_not_divisible_by_n_head():
    one_line_error(lambda: GPTConfig(n_embd=100, n_head=12), "n_embd=100", "n_head=12", "multiple of n_head")


def test_n_head_not_divisible_by_n_kv_head():
    one_line_error(lambda: GPTConfig(n_head=6, n_embd=48, attention=AttentionConfig(n_kv_head=4)),
                   "n_head=6", "n_kv_head=4", "1, 2, 3, 6")
    one_line_error(lambda: AttentionConfig(n_head=6, n_kv_head=4), "n_head=6", "n_kv_head=4")


def test_unknown_variant_lists_valid_names():
    msg = one_line_error(lambda: GPTConfig(attention="rbff"), "'rbff'", "did you mean 'rbf'")
    for name in variants():
        assert name in msg
    one_line_error(lambda: get_variant("nope"), "'nope'", "standard")


def test_unknown_field_suggests_closest():
    one_line_error(lambda: GPTConfig(n_heads=4), "'n_heads'", "did you mean 'n_head'", "block_size")
    one_line_error(lambda: AttentionConfig(kernal="rbf"), "'kernal'", "did you mean 'kernel'")
    one_line_error(lambda: GPTConfig.from_dict({"attention": {"temprature": 2}}), "'attention.temprature'",
                   "did you mean 'attention.temperature'")


@pytest.mark.parametrize("bad, patterns", [
    (dict(kernel="cosine"), ["kernel='cosine'", "'dot'", "'rbf'"]),
    (dict(normalizer="sparsemax"), ["normalizer='sparsemax'", "'softmax'", "'none'"]),
    (dict(mask_form="zero"), ["mask_form='zero'", "'additive'", "'renormalize'"]),
    (dict(temperature=0.0), ["temperature=0.0", "> 0"]),
    (dict(temperature="hot"), ["temperature='hot'", "number"]),
    (dict(dropout=1.5), ["dropout=1.5", "<= 1"]),
    (dict(n_kv_head=0), ["n_kv_head=0", ">= 1"]),
    (dict(backend="sdpa", normalizer="none"), ["backend='sdpa'", "normalizer='none'"]),
])
def test_bad_attention_values(bad, patterns):
    one_line_error(lambda: AttentionConfig(**bad), *patterns)


@pytest.mark.parametrize("bad, patterns", [
    (dict(pos_encoding="xpos"), ["pos_encoding='xpos'", "'rope'", "'alibi'"]),
    (dict(n_layer=0), ["n_layer=0", ">= 1"]),
    (dict(n_layer=2.5), ["n_layer=2.5", "integer"]),
    (dict(n_embd=36, n_head=12, pos_encoding="rope"), ["even head_dim"]),
    (dict(attention=3), ["attention=3", "variant name"]),
    (dict(n_head=4, n_embd=64, attention=AttentionConfig(n_head=8)), ["attention.n_head=8", "n_head=4"]),
])
def test_bad_model_values(bad, patterns):
    one_line_error(lambda: GPTConfig(**bad), *patterns)


def test_registry_entries_are_described_and_resolve():
    assert {"standard", "gqa", "mqa", "rbf"} <= set(variants())
    for name in variants():
        info = variant_info(name)
        assert info.description and info.source
        resolved = GPTConfig(n_head=4, n_embd=32, attention=name).resolved_attention()
        assert resolved.n_head == 4 and resolved.bias is True and resolved.dropout == 0.0
    assert get_variant("mqa").n_kv_head == 1 and get_variant("rbf").kernel == "rbf"


def test_model_fields_flow_into_attention():
    attn = GPTConfig(n_head=4, n_embd=32, bias=False, dropout=0.1, attention="gqa").resolved_attention()
    assert (attn.n_head, attn.n_kv_head, attn.bias, attn.dropout) == (4, 2, False, 0.1)
    own = GPTConfig(n_head=4, n_embd=32, dropout=0.1, attention=AttentionConfig(dropout=0.0)).resolved_attention()
    assert own.dropout == 0.0
