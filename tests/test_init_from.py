"""train.init_from=hf:DIR and data.tokenizer=FILE: fine-tuning starts from a local GPT-2
directory's weights (checked against transformers' model on the same tokens) with its tokenizer.json; mismatches
are one-line errors."""

import pytest
import torch

from attnlab.configio import apply_overrides
from attnlab.data import DataConfig
from attnlab.data.tokenizers import BPETokenizer
from attnlab.train import TrainConfig, load_run, train
from helpers import one_line_error, tiny

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("gpt2")
    tok = BPETokenizer.train(["To be, or not to be, that is the question: whether 'tis nobler in the mind. " * 40], 300)
    cfg = transformers.GPT2Config(vocab_size=tok.vocab_size, n_positions=64, n_embd=32, n_layer=2, n_head=2,
                                  bos_token_id=None, eos_token_id=None)
    torch.manual_seed(0)
    transformers.GPT2LMHeadModel(cfg).save_pretrained(path)
    tok.save(path / "tokenizer.json")
    return path


def hf_vocab(path) -> int:
    return transformers.AutoConfig.from_pretrained(path).vocab_size


def _cfg(run, cache, gpt2_dir, *extra):
    base = tiny(run, cache, train__max_steps=2, train__warmup_steps=1, train__eval_interval=0, train__sample_tokens=0)
    return apply_overrides(base, [f"train.init_from=hf:{gpt2_dir}", f"data.tokenizer={gpt2_dir}/tokenizer.json",
                                  "model.block_size=32", *extra])


def test_fine_tuning_starts_from_the_checkpoint(tmp_path, gpt2_dir):
    """At lr 1e-30 two AdamW steps move no weight: the run's model is the HF model (logits to 1e-5, float32)."""
    run = tmp_path / "run"
    train(_cfg(run, tmp_path / "cache", gpt2_dir, "train.lr=1e-30", "train.min_lr=0"), quiet=True)
    model, tokenizer, cfg = load_run(run)
    assert (cfg.model.n_layer, cfg.model.n_embd, cfg.model.block_size) == (2, 32, 32)
    assert cfg.model.vocab_size == tokenizer.vocab_size == hf_vocab(gpt2_dir)
    hf = transformers.AutoModelForCausalLM.from_pretrained(gpt2_dir).eval()
    idx = torch.tensor([tokenizer.encode("To be, or not to be, that is the question")[:32]])
    with torch.no_grad():
        torch.testing.assert_close(model.eval()(idx)[0], hf(idx).logits, rtol=1e-5, atol=1e-5)


@pytest.mark.slow  # resume itself is tested exactly in test_train.py; CI runs it with the slow tests
def test_resume_keeps_training_from_the_run(tmp_path, gpt2_dir):
    run = tmp_path / "run"
    train(_cfg(run, tmp_path / "cache", gpt2_dir), quiet=True)
    summary = train(_cfg(run, tmp_path / "cache", gpt2_dir, "train.max_steps=4"), resume=run, quiet=True)
    assert summary["status"] == "finished" and summary["steps"] == 4


def test_mismatches_are_one_line(tmp_path, gpt2_dir):
    one_line_error(lambda: train(apply_overrides(_cfg(tmp_path / "a", tmp_path / "c", gpt2_dir), ["data.tokenizer=char"]),
                                 quiet=True), f"has {hf_vocab(gpt2_dir)}", "data.tokenizer=")
    one_line_error(lambda: train(_cfg(tmp_path / "b", tmp_path / "c", gpt2_dir, "model.block_size=128"), quiet=True),
                   "model.block_size=128 exceeds the n_positions=64")
    one_line_error(lambda: TrainConfig(init_from="gpt2"), "must be 'hf:DIR'")
    one_line_error(lambda: DataConfig(tokenizer="nope.json"), "no such file")
    one_line_error(lambda: DataConfig(tokenizer="word"), "'char', 'bpe', or the path of a tokenizer.json")
    one_line_error(lambda: train(_cfg(tmp_path / "d", tmp_path / "c", gpt2_dir, f"train.init_from=hf:{tmp_path}"),
                                 quiet=True), "config.json missing")
