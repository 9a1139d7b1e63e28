"""Copying: ``induction`` (a random sequence repeated) and ``selective-copy`` (copy the tokens scattered among
blanks)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ..errors import strict_fields
from .base import Task, check_int, distinct, sorted_slots


@strict_fields
@dataclass(frozen=True)
class Induction(Task):
    """A random sequence repeated: the second copy is predictable only by attending back to the first.

    The repeated-random-tokens setting in which induction heads are measured (Olsson et al. 2022,
    arXiv:2209.11895); the format here is our own.

    Format. Token ids: ``0`` is the filler ``_``, ``1`` the marker ``|``; symbols ``a0..`` are
    ``2..n_symbols+1``. The stream of T + 1 tokens is ``| s_1 .. s_L | s_1 .. s_L`` followed by filler, with
    L = copy_len and s_1..s_L distinct symbols in random order. The answer positions are the second copy: after
    reading the second marker the model must give s_1, after s_i in the second copy s_(i+1). Because the symbols
    are distinct, every answer is also what an induction head gives (find the earlier occurrence of the current
    token, copy the token after it); the fixed offset L + 1 gives the same.

    Chance. A predictor that ignores the context sees at most the current token and its position. After the
    marker, s_1 is uniform over the n_symbols symbols (best guess right with probability 1 / n_symbols); after s_i,
    s_(i+1) is uniform over the n_symbols - 1 symbols other than s_i (probability 1 / (n_symbols - 1)). Averaged
    over the L answers of a sequence: ``(1 / n_symbols + (L - 1) / (n_symbols - 1)) / L`` (0.0164 at the
    defaults). A constant predictor, blind to the current token too, gets 1 / n_symbols.

    Example (``Induction.tiny().example()``)::

        >>> print(Induction.tiny().example())
        induction(n_symbols=6, copy_len=4, seq_len=11); chance 0.1917
        x | a3 a2 a1 a0 |  a3 a2 a1 a0 _
        y - -  -  -  -  a3 a2 a1 a0 -  -
    """

    name: ClassVar[str] = "induction"
    summary: ClassVar[str] = "a random sequence of distinct symbols, repeated; the second copy is scored"
    tiny_params: ClassVar[dict] = {"n_symbols": 6, "copy_len": 4, "seq_len": 11}

    n_symbols: int = 62
    """Symbols in the vocabulary (at least 2 and at least copy_len, since a copy's symbols are distinct)."""
    copy_len: int = 31
    """L, the length of the random sequence; its two copies and two markers, 2 * L + 2 tokens, fit in seq_len + 1."""
    seq_len: int = 64
    """T, the tokens of x and of y."""

    def __post_init__(self):
        check_int("seq_len", self.seq_len, 3)
        check_int("n_symbols", self.n_symbols, 2)
        check_int("copy_len", self.copy_len, 1, min(self.n_symbols, (self.seq_len + 1) // 2 - 1),
                  f"copy_len <= n_symbols = {self.n_symbols} (distinct symbols), and 2 * copy_len + 2 tokens must "
                  f"fit in seq_len + 1 = {self.seq_len + 1}")

    @property
    def vocab_size(self) -> int:
        return 2 + self.n_symbols

    def token_name(self, token: int) -> str:
        return {0: "_", 1: "|"}.get(token, f"a{token - 2}")

    def chance_accuracy(self) -> float:
        """``(1 / n_symbols + (L - 1) / (n_symbols - 1)) / L``: the first answer of the second copy (after the
        marker) is uniform over all symbols; each later one is uniform over the symbols other than the visible
        current token, which a context-free predictor can exclude. Averaged over the L answers."""
        n, length = self.n_symbols, self.copy_len
        return (1.0 / n + (length - 1) / (n - 1)) / length

    def _stream(self, n, rng):
        length = self.copy_len
        symbols = distinct(rng, n, self.n_symbols, length) + 2
        stream = np.zeros((n, self.seq_len + 1), dtype=np.int64)
        stream[:, 0] = stream[:, length + 1] = 1
        stream[:, 1:length + 1] = symbols
        stream[:, length + 2:2 * length + 2] = symbols
        answer = np.zeros((n, self.seq_len), dtype=bool)
        answer[:, length + 1:2 * length + 1] = True
        return stream, answer


@strict_fields
@dataclass(frozen=True)
class SelectiveCopy(Task):
    """Selective copying: a few symbols scattered among blanks; after the copy marker the model must write them
    out in order, skipping the blanks.

    MAD's selective copying (Poli et al. 2024, arXiv:2403.17844, after the task of Gu and Dao 2023,
    arXiv:2312.00752), written here from the papers' descriptions.

    Format. Token ids: ``0`` is the blank ``.``, ``1`` the copy marker ``>``; symbols ``a0..`` are
    ``2..n_symbols+1``. The stream of T + 1 tokens is a region of ``T - n_copy`` tokens holding ``n_copy``
    symbols, each drawn uniformly (repeats allowed), at random positions among blanks; then ``>``; then the same
    symbols in their order, ``c_1 .. c_n_copy``, which fill the stream to its end. The answer positions are the
    copies: after ``>`` the model must give c_1, after c_j it must give c_(j+1) (the inputs after ``>`` are the
    previous answers, as in any language model).

    Chance. Each copied symbol is uniform over the n_symbols symbols and independent of the current token and of
    the position, so a predictor that ignores the context reaches ``1 / n_symbols`` (0.0625 at the defaults).

    Example (``SelectiveCopy.tiny().example()``)::

        >>> print(SelectiveCopy.tiny().example())
        selective-copy(n_symbols=4, n_copy=3, seq_len=12); chance 0.2500
        x a3 a2 . . . . a2 . . >  a3 a2
        y -  -  - - - - -  - - a3 a2 a2
    """

    name: ClassVar[str] = "selective-copy"
    summary: ClassVar[str] = "copy the symbols scattered among blanks, in order, after a marker (MAD, arXiv:2403.17844)"
    tiny_params: ClassVar[dict] = {"n_symbols": 4, "n_copy": 3, "seq_len": 12}

    n_symbols: int = 16
    """Symbols in the vocabulary (at least 2); chance accuracy is 1 / n_symbols."""
    n_copy: int = 8
    """Symbols to copy per sequence; the region before the marker, seq_len - n_copy tokens, must hold them."""
    seq_len: int = 64
    """T, the tokens of x and of y."""

    def __post_init__(self):
        check_int("seq_len", self.seq_len, 2)
        check_int("n_symbols", self.n_symbols, 2)
        check_int("n_copy", self.n_copy, 1, self.seq_len // 2,
                  f"the region of seq_len - n_copy tokens before the marker must hold n_copy symbols, "
                  f"seq_len = {self.seq_len}")

    @property
    def vocab_size(self) -> int:
        return 2 + self.n_symbols

    def token_name(self, token: int) -> str:
        return {0: ".", 1: ">"}.get(token, f"a{token - 2}")

    def chance_accuracy(self) -> float:
        """``1 / n_symbols``: every answer is a symbol drawn uniformly, independently of the visible token and of
        the position."""
        return 1.0 / self.n_symbols

    def _stream(self, n, rng):
        k, region = self.n_copy, self.seq_len - self.n_copy
        symbols = rng.integers(0, self.n_symbols, size=(n, k)) + 2
        where = sorted_slots(rng, n, region, k)
        stream = np.zeros((n, self.seq_len + 1), dtype=np.int64)
        np.put_along_axis(stream, where, symbols, axis=1)
        stream[:, region] = 1
        stream[:, region + 1:] = symbols
        answer = np.zeros((n, self.seq_len), dtype=bool)
        answer[:, region:] = True
        return stream, answer
