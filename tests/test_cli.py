"""The `attnlab` command: one-line errors with exit status 2, and a tiny end-to-end train / sample / resume."""

import json

import pytest

from attnlab.cli import main


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNLAB_CACHE", str(tmp_path / "cache"))
    return tmp_path


def error_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("attnlab: error: ")
    return err


def test_variants_lists_the_registry(capsys):
    from attnlab import variants

    assert main(["variants"]) == 0
    out = capsys.readouterr().out
    for name in variants():
        assert f"\n{name} " in "\n" + out


@pytest.mark.parametrize("args, expected", [
    (["train", "--preset", "tiny", "train.lrr=1"], ["train.lrr", "did you mean 'train.lr'"]),
    (["train", "--preset", "tny"], ["'tny'", "did you mean 'tiny'"]),
    (["train", "--preset", "tiny", "model.attention=rbff"], ["'rbff'", "did you mean 'rbf'"]),
    (["train", "--preset", "tiny", "model.n_head=3"], ["n_embd=32", "n_head=3"]),
    (["train", "--preset", "tiny", "train.lr=-1"], ["train.lr=-1", "> 0"]),
    (["train", "--preset", "tiny", "model.n_layer"], ["model.n_layer", "KEY=VALUE"]),
    (["train", "--config", "/nonexistent/run.toml"], ["/nonexistent/run.toml"]),
    (["compare", "--preset", "tiny", "--variants", "standard", "nope"], ["'nope'"]),
])
def test_config_mistakes_are_one_line(args, expected, capsys, cache):
    assert main(args) == 2
    err = error_line(capsys)
    for text in expected:
        assert text in err, err


def test_missing_data_names_the_file(capsys, cache):
    missing = cache / "no-such-corpus.txt"
    assert main(["train", "--preset", "tiny", "--data", str(missing), "--out", str(cache / "run")]) == 2
    assert str(missing) in error_line(capsys)


def test_train_sample_and_resume_refusal(capsys, cache):
    run = cache / "run"
    assert main(["train", "--preset", "tiny", "--quiet", "--out", str(run), "train.max_steps=6",
                 "train.warmup_steps=2", "train.sample_tokens=20"]) == 0
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "finished" and summary["steps"] == 6
    capsys.readouterr()
    assert main(["sample", str(run), "--tokens", "40", "--seed", "1"]) == 0
    text = capsys.readouterr().out
    assert len(text) == 41  # 40 characters (char tokenizer) + print's newline
    assert main(["train", "--resume", str(run), "train.lr=1"]) == 2
    assert "--resume" in capsys.readouterr().err
