"""Tokenisers: character-level (:class:`CharTokenizer`), byte-level BPE (:class:`BPETokenizer`) and the ids of a
synthetic task (:class:`TaskTokenizer`).

Both expose ``encode(str) -> list[int]``, ``decode(list[int]) -> str``, ``vocab_size``, ``encode_array(str)`` (a
fast numpy encoding of a long text), ``save(path)`` and the classmethod ``load(path)``; :func:`load_tokenizer` loads
either from its JSON file. The BPE tokeniser is trained offline with Hugging Face ``tokenizers``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from ..errors import ConfigError

TOKENIZERS = ("char", "bpe")
BPE_MIN_VOCAB = 257  # the 256 byte symbols plus at least one merge


class CharTokenizer:
    """One token per character; the vocabulary is the sorted set of characters of a text."""

    kind = "char"

    def __init__(self, chars: str):
        if len(set(chars)) != len(chars) or list(chars) != sorted(chars):
            raise ValueError("CharTokenizer needs distinct characters in sorted order")
        self.chars = chars
        self._codepoints = np.array([ord(c) for c in chars], dtype=np.int64)
        self._index = {c: i for i, c in enumerate(chars)}

    @classmethod
    def train(cls, text: str) -> CharTokenizer:
        """The tokeniser whose vocabulary is every character of ``text``."""
        return cls("".join(sorted(set(text))))

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    def encode(self, text: str) -> list[int]:
        return self.encode_array(text).tolist()

    def encode_array(self, text: str) -> np.ndarray:
        """Token ids of ``text`` as an int64 array; raises ValueError naming the first unknown character."""
        codes = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32).astype(np.int64)
        ids = np.searchsorted(self._codepoints, codes)
        ids = np.minimum(ids, max(len(self.chars) - 1, 0))
        unknown = self._codepoints[ids] != codes if len(self.chars) else np.ones(len(codes), bool)
        if unknown.any():
            pos = int(np.argmax(unknown))
            raise ValueError(f"character {text[pos]!r} at position {pos} is not in the CharTokenizer vocabulary")
        return ids

    def decode(self, ids: Iterable[int]) -> str:
        chars = self.chars
        return "".join(chars[i] for i in ids)

    def to_hf(self):
        """The same tokeniser as a Hugging Face ``tokenizers.Tokenizer``: a word-level vocabulary of the characters,
        every character its own word, decoded by plain concatenation (tests/test_export_hf.py checks it encodes
        and decodes as this one does)."""
        from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

        tok = Tokenizer(models.WordLevel({c: i for i, c in enumerate(self.chars)}, unk_token=None))
        tok.pre_tokenizer = pre_tokenizers.Split(Regex("[\\s\\S]"), behavior="isolated")  # one piece per character
        tok.decoder = decoders.Fuse()
        return tok

    def to_json(self) -> str:
        return json.dumps({"type": self.kind, "chars": self.chars}, ensure_ascii=False)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_json(), encoding="utf-8")

    @classmethod
    def load(cls, path: str | Path) -> CharTokenizer:
        return cls(json.loads(Path(path).read_text(encoding="utf-8"))["chars"])

    def __eq__(self, other) -> bool:
        return isinstance(other, CharTokenizer) and other.chars == self.chars

    def __repr__(self) -> str:
        return f"CharTokenizer(vocab_size={self.vocab_size})"


class BPETokenizer:
    """Byte-level BPE (GPT-2 style, no special tokens) backed by a Hugging Face ``tokenizers.Tokenizer``.

    Any string round-trips exactly: ``decode(encode(s)) == s``.
    """

    kind = "bpe"

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    @classmethod
    def train(cls, texts: Iterable[str], vocab_size: int) -> BPETokenizer:
        """Train a byte-level BPE of at most ``vocab_size`` tokens on ``texts`` (an iterable of strings)."""
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

        if vocab_size < BPE_MIN_VOCAB:
            raise ConfigError(f"data.vocab_size={vocab_size} must be >= {BPE_MIN_VOCAB} for tokenizer='bpe'")
        tokenizer = Tokenizer(models.BPE())
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tokenizer.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            special_tokens=[],
            show_progress=False,
        )
        tokenizer.train_from_iterator(texts, trainer=trainer)
        return cls(tokenizer)

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size()

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def encode_array(self, text: str) -> np.ndarray:
        """Token ids of ``text`` as an int64 array."""
        return np.asarray(self.encode(text), dtype=np.int64)

    def decode(self, ids: Iterable[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=False)

    def to_hf(self):
        """The Hugging Face ``tokenizers.Tokenizer`` itself."""
        return self.tokenizer

    def to_json(self) -> str:
        return self.tokenizer.to_str()

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_json(), encoding="utf-8")

    @classmethod
    def load(cls, path: str | Path) -> BPETokenizer:
        from tokenizers import Tokenizer

        return cls(Tokenizer.from_file(str(path)))

    def __eq__(self, other) -> bool:
        return isinstance(other, BPETokenizer) and other.to_json() == self.to_json()

    def __repr__(self) -> str:
        return f"BPETokenizer(vocab_size={self.vocab_size})"


class TaskTokenizer:
    """The tokens of a synthetic task (attnlab.tasks) are already ids: text is the ids written as decimal numbers
    separated by spaces ("3 17 4"), so a prompt or a sample of a task run reads as its token sequence."""

    kind = "task"

    def __init__(self, vocab_size: int, task: str):
        self._vocab_size, self.task = int(vocab_size), task

    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    def encode(self, text: str) -> list[int]:
        ids = []
        for word in text.split():
            if not word.isdigit() or int(word) >= self._vocab_size:
                raise ValueError(f"{word!r} is not a token of task {self.task!r} (ids 0..{self._vocab_size - 1}, "
                                 f"separated by spaces)")
            ids.append(int(word))
        if not ids:
            raise ValueError(f"no token ids in {text!r}; a task prompt is ids separated by spaces, e.g. '3 17 4'")
        return ids

    def decode(self, ids: Iterable[int]) -> str:
        return " ".join(str(int(i)) for i in ids)

    def to_hf(self):
        """A Hugging Face ``tokenizers.Tokenizer`` with the same ids: words "0".."V-1" split at whitespace,
        decoded joined by spaces."""
        from tokenizers import Tokenizer, models, pre_tokenizers

        tok = Tokenizer(models.WordLevel({str(i): i for i in range(self._vocab_size)}, unk_token=None))
        tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
        return tok

    def to_json(self) -> str:
        return json.dumps({"type": self.kind, "vocab_size": self._vocab_size, "task": self.task})

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_json(), encoding="utf-8")

    @classmethod
    def load(cls, path: str | Path) -> TaskTokenizer:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        return cls(data["vocab_size"], data["task"])

    def __eq__(self, other) -> bool:
        return isinstance(other, TaskTokenizer) and other.to_json() == self.to_json()

    def __repr__(self) -> str:
        return f"TaskTokenizer(vocab_size={self._vocab_size}, task={self.task!r})"


Tokenizer = CharTokenizer | BPETokenizer | TaskTokenizer


def load_tokenizer(path: str | Path) -> Tokenizer:
    """Load a tokeniser saved by ``save``: a char or task one (``{"type": "char" | "task"}``) or a Hugging Face BPE
    file."""
    with open(path, encoding="utf-8") as f:
        kind = json.load(f).get("type")
    return {CharTokenizer.kind: CharTokenizer, TaskTokenizer.kind: TaskTokenizer}.get(kind, BPETokenizer).load(path)
