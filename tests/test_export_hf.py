"""`attnlab export-hf`: a GPT-2-architecture run becomes a transformers GPT2LMHeadModel directory
that gives the same logits; its tokenizer files encode and decode as the run's tokenizer; other architectures
are refused in one line."""

import pytest
import torch

from attnlab import GPT, GPTConfig
from attnlab.cli import main
from attnlab.configio import apply_overrides
from attnlab.data.tokenizers import CharTokenizer, TaskTokenizer
from attnlab.hf.gpt2 import export_gpt2, gpt2_refusal
from attnlab.train import load_run, train
from helpers import one_line_error, tiny

transformers = pytest.importorskip("transformers")


def test_a_trained_run_exports_with_the_same_logits_and_tokenizer(tmp_path, capsys):
    run = tmp_path / "run"
    train(apply_overrides(tiny(run, tmp_path / "cache", train__max_steps=3, train__warmup_steps=1,
                               train__eval_interval=0, train__sample_tokens=0), ["model.dropout=0.1"]), quiet=True)
    assert main(["export-hf", str(run), str(tmp_path / "hf")]) == 0
    assert "from_pretrained" in capsys.readouterr().out
    model, tokenizer, _ = load_run(run)
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    hf_tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    text = "First Citizen:\nBefore we proceed any further, hear me speak."
    ids = tokenizer.encode(text)
    assert hf_tok(text, add_special_tokens=False)["input_ids"] == ids
    assert hf_tok.decode(ids) == text
    idx = torch.tensor([ids[:model.config.block_size]])
    with torch.no_grad():
        # float32 on both sides, the same operations in another order: 1e-5
        torch.testing.assert_close(hf(idx).logits, model.eval()(idx)[0], rtol=1e-5, atol=1e-5)


def test_gelu_and_unscaled_attention_export_too(tmp_path):
    cfg = GPTConfig(vocab_size=40, block_size=16, n_layer=2, n_head=2, n_embd=16, activation="gelu",
                    attention={"scale": 1.0}, mlp_ratio=2)
    torch.manual_seed(0)
    model = GPT(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    export_gpt2(model, tmp_path / "hf")
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    idx = torch.randint(0, 40, (2, 16))
    with torch.no_grad():
        torch.testing.assert_close(hf(idx).logits, model(idx)[0], rtol=1e-5, atol=1e-5)


def test_char_and_task_tokenizers_as_hf_tokenizers():
    char = CharTokenizer.train("ab\n\t é,;")
    text = "a\tb é\n,;;"
    assert char.to_hf().encode(text, add_special_tokens=False).ids == char.encode(text)
    assert char.to_hf().decode(char.encode(text)) == text
    task = TaskTokenizer(30, "mqar")
    assert task.to_hf().encode("3 17  29 0", add_special_tokens=False).ids == [3, 17, 29, 0]
    assert task.to_hf().decode([3, 17, 29]) == task.decode([3, 17, 29])


@pytest.mark.parametrize("change, reason", [
    (dict(pos_encoding="rope"), "pos_encoding='rope'"), (dict(attention="rbf"), "attention 'rbf'"),
    (dict(attention="gqa"), "K/V heads"), (dict(bias=False), "bias=false"),
    (dict(mlp_ratio=0), "mlp_ratio=0"),
])
def test_other_architectures_are_refused(change, reason, tmp_path):
    cfg = GPTConfig(vocab_size=40, block_size=16, n_layer=1, n_head=4, n_embd=16, **change)
    assert reason in gpt2_refusal(cfg)
    one_line_error(lambda: export_gpt2(GPT(cfg), tmp_path / "x"), "cannot export as GPT-2", reason)
