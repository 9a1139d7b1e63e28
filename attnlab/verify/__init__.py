"""The claims ledger (`attnlab verify`): every claim of the seed write-ups as a measurement.

Each check measures one number with attnlab's code or an independent general method, and
:func:`~attnlab.verify.ledger.judge` compares it with the claimed value under a stated tolerance. Rows of kind
``obs`` are observations the seeds do not claim (their "claimed" value is our prediction). Each check records the
outcome the ledger expects (holds, refuted with its reason, or as predicted); a row's verdict is that outcome when
the measurement reproduces it and FAIL otherwise. See :mod:`attnlab.verify.ledger` for the machinery; the checks
live in ``seed000`` .. ``seed003``.
"""

from __future__ import annotations

import sys

from . import seed000, seed001, seed002, seed003  # noqa: F401  (registers the checks, in this order)
from .ledger import (CHECKS, FAIL, VERDICTS, Check, Record, exit_status, format_table, judge, run_check, run_checks,
                     to_json)


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


__all__ = ["CHECKS", "FAIL", "VERDICTS", "Check", "Record", "exit_status", "format_table", "judge", "main",
           "run_check", "run_checks", "to_json"]
