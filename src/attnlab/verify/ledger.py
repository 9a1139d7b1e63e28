"""The claims ledger's machinery: a record per check, one judge for every comparison, the registry, the table.

A check is a small function that *measures* one number (with attnlab's code, or an independent general method:
SLSQP, autograd, Monte Carlo) and returns it; it never decides whether it agrees. :func:`judge` compares the
measured number with the claimed one under the check's relation and tolerance, the same way for every check, so
no check can be wired to agree: give it a wrong claimed value (``run_check(id, claimed=...)``) and it disagrees,
and its verdict becomes FAIL.

Two kinds of rows:

* ``claim``: something a write-up states. The measurement either agrees with it (outcome "holds") or
  contradicts it (outcome "refuted").
* ``obs``: an observation the write-ups do not claim, added where a write-up's statement needs a boundary (e.g. the
  permutation invariance of the masking write-up holds for one layer, not two). The "claimed" cell holds *our* prediction;
  the outcome is "as predicted" or "not as predicted".

Every check also records the outcome the ledger expects (``expect``): "holds" for a claim unless the check says
``expect="refuted"`` and gives the reason (``because``, the finding that refutes it); "as predicted" for an
observation. A row's verdict is its outcome when that is the recorded one, and "FAIL" otherwise: a regression in
attnlab, or a number that changed. So the verdicts are holds / refuted / as predicted / FAIL, and a claim recorded
as refuted that now holds is a FAIL too.
"""

from __future__ import annotations

import dataclasses
import json
import math
import textwrap
from dataclasses import dataclass, field
from typing import Callable

RELATIONS = ("=", "<=", ">=", ">")
HOLDS, REFUTED, AS_PREDICTED, NOT_AS_PREDICTED, FAIL = "holds", "refuted", "as predicted", "not as predicted", "FAIL"
VERDICTS = (HOLDS, REFUTED, AS_PREDICTED, FAIL)  # the verdict column, in the summary's order
EXPECTATIONS = {"claim": (HOLDS, REFUTED), "obs": (AS_PREDICTED,)}  # what a check may record, by kind

# The four write-ups whose claims the ledger measures (docs/sources.md), in the ledger's order: key -> title
WRITEUPS = {
    "magnitude": "Magnitude Attention",
    "boneless": "Boneless attention",
    "masking": "Masking and positional encodings",
    "softmax": "Why dot products, why softmax",
}


def outcome(kind: str, agrees: bool) -> str:
    """What a judged measurement says about a row: holds / refuted (claim), as predicted / not (obs)."""
    if kind == "claim":
        return HOLDS if agrees else REFUTED
    return AS_PREDICTED if agrees else NOT_AS_PREDICTED


def verdict(outcome: str, expected: str) -> str:
    """The row's verdict: its outcome when that reproduces the recorded one, else FAIL."""
    return outcome if outcome == expected else FAIL


def exit_status(records, strict_claims: bool = False) -> int:
    """`attnlab verify`'s exit status: 0 when every row reproduces its recorded verdict (no FAIL), else 1;
    with ``strict_claims`` also 1 when any claim is refuted."""
    verdicts = {r.verdict for r in records}
    return 1 if FAIL in verdicts or (strict_claims and REFUTED in verdicts) else 0


def judge(relation: str, claimed: float, measured: float | None, tolerance: float) -> bool:
    """Whether ``measured`` agrees with ``claimed``: the only place a verdict is made.

    "="  : |measured - claimed| <= tolerance
    "<=" : measured <= claimed + tolerance        (a bound that must hold)
    ">=" : measured >= claimed - tolerance
    ">"  : measured >  claimed + tolerance        ("it changes": strictly above the noise floor)
    A measurement that is not a finite number never agrees.
    """
    if measured is None or not math.isfinite(measured) or not math.isfinite(tolerance):
        return False
    if relation == "=":
        return abs(measured - claimed) <= tolerance
    if relation == "<=":
        return measured <= claimed + tolerance
    if relation == ">=":
        return measured >= claimed - tolerance
    if relation == ">":
        return measured > claimed + tolerance
    raise ValueError(f"relation={relation!r}; choose one of {RELATIONS}")


@dataclass
class Record:
    """One row of the ledger (and one object of ``--json``)."""

    id: str
    writeup: str  # which write-up states the claim: a key of WRITEUPS ("magnitude", "boneless", ...)
    kind: str  # "claim" or "obs"
    claim: str
    relation: str
    claimed: float
    claimed_text: str
    measured: float | None
    measured_text: str
    tolerance: float
    tolerance_basis: str  # why this tolerance, in a few words
    agrees: bool  # judge(): the measurement agrees with the claimed value (or prediction)
    outcome: str  # holds / refuted (claim), as predicted / not as predicted (obs)
    expected: str  # the recorded outcome: holds / refuted / as predicted
    expected_because: str  # why a claim is recorded as refuted ("" otherwise)
    verdict: str  # the outcome if it is the recorded one, else FAIL
    volatile: bool  # measured value is rounding/optimiser noise: its digits vary between machines
    note: str = ""
    details: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return _finite(dataclasses.asdict(self))


def _finite(obj):
    """Strict JSON: non-finite floats become strings."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return repr(obj)
    if isinstance(obj, dict):
        return {str(k): _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


@dataclass(frozen=True)
class Check:
    """A registered check: what is claimed, how it is compared, and the function that measures."""

    id: str
    writeup: str
    kind: str
    claim: str
    relation: str
    claimed: float
    tolerance: float
    tolerance_basis: str
    fn: Callable[..., dict]
    claimed_label: str = ""  # e.g. "20/70": shown as "20/70 = 0.2857"; "{v} (argmax)": "0 (argmax)"
    volatile: bool = False
    digits: int = 4
    expect: str = HOLDS  # the recorded outcome: holds / refuted (claim), as predicted (obs)
    because: str = ""  # why a claim is recorded as refuted


CHECKS: dict[str, Check] = {}


def check(id: str, *, writeup: str, claim: str, relation: str, claimed: float, tolerance: float, basis: str,
          kind: str = "claim", label: str = "", volatile: bool = False, digits: int = 4, expect: str | None = None,
          because: str = ""):
    """Register the decorated measuring function under ``id``.

    The function takes keyword parameters (the setting of the measurement) and returns a dict with
    ``measured`` (a float) and optionally ``note``, ``details``, and ``claimed`` / ``tolerance`` when these
    follow from its parameters (e.g. 1/(N + eps), or 5 Monte-Carlo standard errors).

    ``expect`` is the outcome the ledger records: "holds" (a claim's default), "refuted" (a claim our
    measurements contradict; ``because`` must say how) or "as predicted" (an observation's only value).
    """
    if relation not in RELATIONS:
        raise ValueError(f"relation={relation!r}; choose one of {RELATIONS}")
    if writeup not in WRITEUPS:
        raise ValueError(f"writeup={writeup!r}; choose one of {tuple(WRITEUPS)}")
    if kind not in EXPECTATIONS:
        raise ValueError(f"kind={kind!r}; choose 'claim' or 'obs'")
    expect = EXPECTATIONS[kind][0] if expect is None else expect
    if expect not in EXPECTATIONS[kind]:
        raise ValueError(f"expect={expect!r} for kind {kind!r}; choose one of {EXPECTATIONS[kind]}")
    if (expect == REFUTED) != bool(because):
        raise ValueError(f"check {id!r}: give the reason (because=...) exactly when expect='refuted'")

    def register(fn):
        if id in CHECKS:
            raise ValueError(f"check {id!r} registered twice")
        CHECKS[id] = Check(id, writeup, kind, claim, relation, claimed, tolerance, basis, fn, label, volatile, digits,
                           expect, because)
        return fn

    return register


def fmt_number(x: float | None, digits: int = 4, volatile: bool = False) -> str:
    """Fixed formatting: ``digits`` significant digits, 1 for volatile (rounding-noise) values."""
    if x is None or not math.isfinite(x):
        return str(x)
    if x == 0:
        return "0"
    if volatile:
        return f"{x:.0e}"
    return f"{x:.{digits}g}"


def _claimed_text(relation: str, claimed: float, label: str, digits: int) -> str:
    """label: "20/70" gives "20/70 = 0.2857"; a label with "{v}" is filled with the value ("{v} (argmax)")."""
    value = fmt_number(claimed, digits)
    if "{v}" in label:
        text = label.format(v=value)
    elif label and relation == "=":
        text = f"{label} = {value}"
    else:
        text = label or value
    return text if relation == "=" else f"{relation} {text}"


def run_check(id: str, *, claimed: float | None = None, relation: str | None = None,
              tolerance: float | None = None, **params) -> Record:
    """Measure check ``id`` and judge it. ``claimed`` / ``relation`` / ``tolerance`` replace the registered
    claim (e.g. to plant a wrong one); ``params`` go to the measuring function."""
    c = CHECKS[id]
    out = c.fn(**params)
    measured = out["measured"]
    measured = None if measured is None else float(measured)
    label = "" if (claimed is not None or relation is not None) else c.claimed_label  # planted: show the number
    claimed = float(out.get("claimed", c.claimed) if claimed is None else claimed)
    relation = c.relation if relation is None else relation
    tolerance = float(out.get("tolerance", c.tolerance) if tolerance is None else tolerance)
    agrees = judge(relation, claimed, measured, tolerance)
    found = outcome(c.kind, agrees)
    return Record(
        id=c.id, writeup=c.writeup, kind=c.kind, claim=c.claim, relation=relation, claimed=float(claimed),
        claimed_text=_claimed_text(relation, claimed, label, c.digits), measured=measured,
        measured_text=fmt_number(measured, c.digits, c.volatile), tolerance=tolerance,
        tolerance_basis=c.tolerance_basis, agrees=agrees, outcome=found, expected=c.expect,
        expected_because=c.because, verdict=verdict(found, c.expect), volatile=c.volatile,
        note=out.get("note", ""), details=out.get("details", {}),
    )


def run_checks(ids=None) -> list[Record]:
    """Every registered check (or those in ``ids``), in registration order."""
    return [run_check(i) for i in (CHECKS if ids is None else ids)]


# ---------------------------------------------------------------------------------------------------------- table

# (header, width, align); the claim, claimed and basis cells wrap onto further lines of the row
COLUMNS = (("#", 2, ">"), ("claim", 56, "<"), ("write-up", 9, "<"), ("kind", 5, "<"), ("claimed", 17, "<"),
           ("measured", 9, ">"), ("tol", 7, ">"), ("tolerance basis", 24, "<"), ("verdict", 12, "<"))
SEP = "  "


def column_span(name: str) -> tuple[int, int]:
    """Character span [start, end) of column ``name`` in every table line."""
    start = 0
    for header, width, _ in COLUMNS:
        if header == name:
            return start, start + width
        start += width + len(SEP)
    raise KeyError(name)


def fmt_tolerance(tol: float) -> str:
    return "0" if tol == 0 else (f"{tol:.0e}" if tol < 1e-3 else f"{tol:.2g}")


def _wrap(text: str, width: int) -> list[str]:
    return textwrap.wrap(text, width, break_long_words=True, break_on_hyphens=False) or [""]


def _verdict_cell(r: Record) -> list[str]:
    """The verdict; under FAIL, what was measured and what the ledger records."""
    if r.verdict != FAIL:
        return [r.verdict]
    return [FAIL] + _wrap(f"({r.outcome}, recorded {r.expected})", 12)


def _row_lines(n: int, r: Record) -> list[str]:
    cells = [[str(n)], _wrap(r.claim, 56), [r.writeup], [r.kind], _wrap(r.claimed_text, 17), [r.measured_text],
             [fmt_tolerance(r.tolerance)], _wrap(r.tolerance_basis, 24), _verdict_cell(r)]
    height = max(len(c) for c in cells)
    lines = []
    for k in range(height):
        parts = []
        for (header, width, align), cell in zip(COLUMNS, cells):
            text = cell[k] if k < len(cell) else ""
            parts.append(f"{text:{align}{width}}")
        lines.append(SEP.join(parts).rstrip())
    return lines


def summary_counts(records: list[Record]) -> dict[str, int]:
    """How many rows have each verdict: {"holds": .., "refuted": .., "as predicted": .., "FAIL": ..}."""
    return {v: sum(r.verdict == v for r in records) for v in VERDICTS}


def summary_line(records: list[Record]) -> str:
    """The table's last line, e.g. '35 holds, 4 refuted, 8 as predicted, 0 FAIL'."""
    return ", ".join(f"{n} {v}" for v, n in summary_counts(records).items())


def format_table(records: list[Record]) -> str:
    """The ledger as fixed-width text, ending with the line of verdict counts (:func:`summary_line`)."""
    header = SEP.join(f"{h:{a}{w}}" for h, w, a in COLUMNS).rstrip()
    rule = SEP.join("-" * w for _, w, _ in COLUMNS)
    lines = [header, rule]
    writeup = None
    for n, r in enumerate(records, 1):
        if writeup is not None and r.writeup != writeup:
            lines.append("")
        writeup = r.writeup
        lines += _row_lines(n, r)
    lines.append(rule)
    failed = summary_counts(records)[FAIL]
    if failed:
        lines.append(f"{failed} of {len(records)} rows do not reproduce their recorded verdict (FAIL: a regression "
                     "in attnlab, or a number that changed)")
    else:
        lines.append("every row reproduces its recorded verdict; 'refuted': the measurement contradicts the "
                     "write-up's claim, as the ledger records")
    lines.append(summary_line(records))
    return "\n".join(lines)


def to_json(records: list[Record]) -> str:
    """Strict JSON: the verdict counts, the exit status with and without --strict-claims, and every record."""
    return json.dumps({"verdicts": summary_counts(records), "exit_status": exit_status(records),
                       "exit_status_strict_claims": exit_status(records, strict_claims=True),
                       "records": [r.to_dict() for r in records]}, indent=2, allow_nan=False) + "\n"
