"""Words the code does not use: internal issue numbers, the words of how the work was organised, and numbered
write-ups.

The package (``attnlab/**/*.py``, ``attnlab/**/*.toml``), the tests and the benchmarks say what a thing is, not which
ticket asked for it: a comment or docstring names the experiment, the write-up or the paper. "Seed" means the random
seed only; the four write-ups are named by title (the Magnitude Attention, Boneless, masking and softmax write-ups,
docs/sources.md). Their former numbered names survive only as aliases, in one table (``ALLOWED_LEGACY``).

The patterns are assembled from pieces, so that this file does not match them itself.
"""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# (what, pattern): each a regex a line must not match
FORBIDDEN = (
    ("an internal issue number", re.compile(r"\b[Ii]ssue" + r"s? ?#?\d+")),
    ("a session word", re.compile(r"\b[Ss]ession" + r"s?\b")),
    ("a numbered write-up (name it by title)", re.compile(r"\b[Ss]eed" + r"s?[ _-]?0" + r"0\d")),
)

# The one place the write-ups' former names appear: `attnlab verify` accepts them as aliases.
ALLOWED_LEGACY = ("src/attnlab/verify/aliases.py",)


THIS_FILE = "tests/test_words.py"


def _files() -> list[str]:
    paths = [*ROOT.glob("src/attnlab/**/*.py"), *ROOT.glob("src/attnlab/**/*.toml"), *ROOT.glob("tests/**/*.py"),
             *(p for p in ROOT.glob("benchmarks/**/*") if p.is_file() and p.suffix in (".py", ".sh", ".toml"))]
    return sorted({p.relative_to(ROOT).as_posix() for p in paths} - {THIS_FILE})


def _hits(rel: str) -> list[str]:
    hits = []
    text = (ROOT / rel).read_text(encoding="utf-8")
    for n, line in enumerate(text.splitlines(), 1):
        for what, pattern in FORBIDDEN:
            if rel in ALLOWED_LEGACY and what.startswith("a numbered write-up"):
                continue
            m = pattern.search(line)
            if m:
                hits.append(f"{rel}:{n}: {what}: {m.group(0)!r} in {line.strip()[:100]!r}")
    return hits


def test_the_scanned_files_exist():
    files = _files()
    assert "src/attnlab/registry.py" in files and "src/attnlab/verify/ledger.py" in files and "benchmarks/magnitude.py" in files
    assert any(f.endswith(".toml") for f in files) and any(f.startswith("tests/") for f in files)
    for rel in ALLOWED_LEGACY:  # a stale entry would hide nothing and should go
        assert (ROOT / rel).is_file(), f"{rel} is listed but does not exist"


def test_no_issue_numbers_session_words_or_numbered_write_ups():
    hits = [h for rel in _files() for h in _hits(rel)]
    assert not hits, "reword these lines:\n" + "\n".join(hits)


@pytest.mark.parametrize("line, what", [
    ("# recall: " + "issue" + " 15 item 5, the recall experiment", "an internal issue number"),
    ("see " + "Issues" + " #16 and 18", "an internal issue number"),
    ("the second " + "session" + "'s checks", "a session word"),
    ("(" + "seed" + " 000, step 2)", "a numbered write-up (name it by title)"),
    ("from . import " + "seed" + "001", "a numbered write-up (name it by title)"),
    ("docs/sources.md#" + "seed" + "-002", "a numbered write-up (name it by title)"),
])
def test_the_patterns_catch_what_they_name(line, what):
    assert [w for w, p in FORBIDDEN if p.search(line)] == [what]


@pytest.mark.parametrize("line", [
    "torch.manual_seed(0)", "seed: int = 1337", "--seeds 0 1 2", "runs/x/standard/seed0", "(seed 0: 13.9% at step 1250)",
    "start_new_session=True", "the Magnitude Attention write-up, step 2", "an issue with the tolerance",
])
def test_the_patterns_leave_ordinary_words_alone(line):
    assert not [w for w, p in FORBIDDEN if p.search(line)]


def test_legacy_names_still_select_the_write_ups():
    from attnlab.verify import CHECKS, LEGACY_NAMES, WRITEUPS, select

    assert set(LEGACY_NAMES.values()) == set(WRITEUPS)
    for old, new in LEGACY_NAMES.items():
        assert select([old]) == select([new]) == [i for i, c in CHECKS.items() if c.writeup == new]
    assert select(["lse-max", "hijack-unique"]) == ["hijack-unique", "lse-max"]  # registration order
    with pytest.raises(ValueError):
        select(["no-such-check"])


def test_verify_accepts_a_write_up_or_its_former_name(tmp_path, capsys):
    from attnlab.cli import main

    out = tmp_path / "masking.json"
    assert main(["verify", "seed" + "002", "--json", str(out)]) == 0
    import json

    records = json.loads(out.read_text())["records"]
    assert records and {r["writeup"] for r in records} == {"masking"}
    assert "write-up" in capsys.readouterr().out.split("\n")[0]
    assert main(["verify", "no-such-write-up"]) == 2
