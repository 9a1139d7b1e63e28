"""The claims ledger (`attnlab verify`): every claim of the four write-ups (docs/sources.md) as a measurement.

Each check measures one number with attnlab's code or an independent general method, and
:func:`~attnlab.verify.ledger.judge` compares it with the claimed value under a stated tolerance. Rows of kind
``obs`` are observations the write-ups do not claim (their "claimed" value is our prediction). Each check records the
outcome the ledger expects (holds, refuted with its reason, or as predicted); a row's verdict is that outcome when
the measurement reproduces it and FAIL otherwise. See :mod:`attnlab.verify.ledger` for the machinery; the checks
live in one module per write-up: ``magnitude`` (Magnitude Attention), ``boneless`` (Boneless attention),
``masking`` (Masking and positional encodings) and ``softmax`` (Why dot products, why softmax).
"""

from __future__ import annotations

import sys

from . import magnitude, boneless, masking, softmax  # noqa: F401  (registers the checks, in this order)
from .aliases import LEGACY_NAMES
from .ledger import (CHECKS, FAIL, VERDICTS, WRITEUPS, Check, Record, exit_status, format_table, judge, run_check,
                     run_checks, to_json)


def select(names) -> list[str]:
    """The check ids that ``names`` pick, in registration order: each name is a write-up's key (``magnitude``,
    ``boneless``, ``masking``, ``softmax``; its former name in :data:`~attnlab.verify.aliases.LEGACY_NAMES` is an
    alias) or a check id.
    An unknown name raises ValueError."""
    wanted = set()
    for name in names:
        name = LEGACY_NAMES.get(name, name)
        if name in WRITEUPS:
            wanted |= {i for i, c in CHECKS.items() if c.writeup == name}
        elif name in CHECKS:
            wanted.add(name)
        else:
            raise ValueError(f"{name!r} is neither a write-up ({', '.join(WRITEUPS)}) nor a check id "
                             "(`attnlab verify --list`)")
    return [i for i in CHECKS if i in wanted]


def main(json_path=None, out=None, strict_claims: bool = False, ids=None) -> int:
    """Run every check (or those in ``ids``), print the table (to ``out``, default stdout), optionally write JSON.

    Returns 0 when every row reproduces its recorded verdict (no FAIL), else 1; with ``strict_claims`` also 1 when
    any claim is refuted.
    """
    from ..atomic import write_text

    out = sys.stdout if out is None else out
    records = run_checks(ids)
    print(format_table(records), file=out)
    if json_path:
        write_text(json_path, to_json(records))
    return exit_status(records, strict_claims)


__all__ = ["CHECKS", "FAIL", "LEGACY_NAMES", "VERDICTS", "WRITEUPS", "Check", "Record", "exit_status", "format_table",
           "judge", "main", "run_check", "run_checks", "select", "to_json"]
