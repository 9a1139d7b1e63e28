"""The claims ledger's machinery: a record per check, one judge for every comparison, the registry, the table.

A check is a small function that *measures* one number (with attnlab's code, or an independent general method:
SLSQP, autograd, Monte Carlo) and returns it; it never decides whether it passed. :func:`judge` compares the
measured number with the claimed one under the check's relation and tolerance, the same way for every check, so
no check can be wired to pass: give it a wrong claimed value (``run_check(id, claimed=...)``) and it fails.

Two kinds of rows:

* ``claim``: something a seed write-up states; "pass" means the measurement agrees with the seed.
* ``obs``: an observation the seeds do not claim, added where the seed's statement needs a boundary (e.g. the
  permutation invariance of seed 002 holds for one layer, not two). The "claimed" cell holds *our* prediction,
  and "pass" means "measured as we predicted".
"""

from __future__ import annotations

import dataclasses
import json
import math
import textwrap
from dataclasses import dataclass, field
from typing import Callable

RELATIONS = ("=", "<=", ">=", ">")


def judge(relation: str, claimed: float, measured: float | None, tolerance: float) -> bool:
    """Whether ``measured`` agrees with ``claimed``: the only place a verdict is made.

    "="  : |measured - claimed| <= tolerance
    "<=" : measured <= claimed + tolerance        (a bound that must hold)
    ">=" : measured >= claimed - tolerance
    ">"  : measured >  claimed + tolerance        ("it changes": strictly above the noise floor)
    A measurement that is not a finite number fails.
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
    seed: str  # "000", "002", "003"
    kind: str  # "claim" or "obs"
    claim: str
    relation: str
    claimed: float
    claimed_text: str
    measured: float | None
    measured_text: str
    tolerance: float
    tolerance_basis: str  # why this tolerance, in a few words
    passed: bool
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
    seed: str
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


CHECKS: dict[str, Check] = {}


def check(id: str, *, seed: str, claim: str, relation: str, claimed: float, tolerance: float, basis: str,
          kind: str = "claim", label: str = "", volatile: bool = False, digits: int = 4):
    """Register the decorated measuring function under ``id``.

    The function takes keyword parameters (the setting of the measurement) and returns a dict with
    ``measured`` (a float) and optionally ``note``, ``details``, and ``claimed`` / ``tolerance`` when these
    follow from its parameters (e.g. 1/(N + eps), or 5 Monte-Carlo standard errors).
    """
    if relation not in RELATIONS:
        raise ValueError(f"relation={relation!r}; choose one of {RELATIONS}")
    if kind not in ("claim", "obs"):
        raise ValueError(f"kind={kind!r}; choose 'claim' or 'obs'")

    def register(fn):
        if id in CHECKS:
            raise ValueError(f"check {id!r} registered twice")
        CHECKS[id] = Check(id, seed, kind, claim, relation, claimed, tolerance, basis, fn, label, volatile, digits)
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
    return Record(
        id=c.id, seed=c.seed, kind=c.kind, claim=c.claim, relation=relation, claimed=float(claimed),
        claimed_text=_claimed_text(relation, claimed, label, c.digits), measured=measured,
        measured_text=fmt_number(measured, c.digits, c.volatile), tolerance=tolerance,
        tolerance_basis=c.tolerance_basis, passed=judge(relation, claimed, measured, tolerance),
        volatile=c.volatile, note=out.get("note", ""), details=out.get("details", {}),
    )


def run_checks(ids=None) -> list[Record]:
    """Every registered check (or those in ``ids``), in registration order."""
    return [run_check(i) for i in (CHECKS if ids is None else ids)]


# ---------------------------------------------------------------------------------------------------------- table

# (header, width, align); the claim, claimed and basis cells wrap onto further lines of the row
COLUMNS = (("#", 2, ">"), ("claim", 56, "<"), ("seed", 4, "<"), ("kind", 5, "<"), ("claimed", 17, "<"),
           ("measured", 9, ">"), ("tol", 7, ">"), ("tolerance basis", 24, "<"), ("result", 6, "<"))
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


def _row_lines(n: int, r: Record) -> list[str]:
    result = "pass" if r.passed else "FAIL"  # for an obs row: measured as we predicted, or not
    cells = [[str(n)], _wrap(r.claim, 56), [r.seed], [r.kind], _wrap(r.claimed_text, 17), [r.measured_text],
             [fmt_tolerance(r.tolerance)], _wrap(r.tolerance_basis, 24), [result]]
    height = max(len(c) for c in cells)
    lines = []
    for k in range(height):
        parts = []
        for (header, width, align), cell in zip(COLUMNS, cells):
            text = cell[k] if k < len(cell) else ""
            parts.append(f"{text:{align}{width}}")
        lines.append(SEP.join(parts).rstrip())
    return lines


def summary_counts(records: list[Record]) -> tuple[int, int]:
    passed = sum(r.passed for r in records)
    return passed, len(records) - passed


def format_table(records: list[Record]) -> str:
    """The ledger as fixed-width text, ending with the line 'N passed, M failed'."""
    header = SEP.join(f"{h:{a}{w}}" for h, w, a in COLUMNS).rstrip()
    rule = SEP.join("-" * w for _, w, _ in COLUMNS)
    lines = [header, rule]
    seed = None
    for n, r in enumerate(records, 1):
        if seed is not None and r.seed != seed:
            lines.append("")
        seed = r.seed
        lines += _row_lines(n, r)
    lines.append(rule)
    claims = [r for r in records if r.kind == "claim"]
    obs = [r for r in records if r.kind == "obs"]
    lines.append(f"claims from the seeds: {sum(r.passed for r in claims)} passed, "
                 f"{len(claims) - sum(r.passed for r in claims)} failed; observations beyond the seeds (kind obs, "
                 f"'claimed' is our prediction): {sum(r.passed for r in obs)} as predicted, "
                 f"{len(obs) - sum(r.passed for r in obs)} not")
    passed, failed = summary_counts(records)
    lines.append(f"{passed} passed, {failed} failed")
    return "\n".join(lines)


def to_json(records: list[Record]) -> str:
    passed, failed = summary_counts(records)
    return json.dumps({"passed": passed, "failed": failed, "records": [r.to_dict() for r in records]},
                      indent=2, allow_nan=False) + "\n"
