"""The claims ledger (`attnlab verify`): every claim of the seed write-ups as a measurement.

Each check measures one number with attnlab's code or an independent general method, and
:func:`~attnlab.verify.ledger.judge` compares it with the claimed value under a stated tolerance. Rows of kind
``obs`` are observations the seeds do not claim (their "claimed" value is our prediction). See
:mod:`attnlab.verify.ledger` for the machinery; the checks live in ``seed000`` .. ``seed003``.
"""

from __future__ import annotations

import sys

from . import seed000, seed001, seed002, seed003  # noqa: F401  (registers the checks, in this order)
from .ledger import CHECKS, Check, Record, format_table, judge, run_check, run_checks, to_json


def main(json_path=None, out=None) -> int:
    """Run every check, print the table (to ``out``, default stdout), optionally write JSON; 0 if all pass."""
    from ..atomic import write_text

    out = sys.stdout if out is None else out
    records = run_checks()
    print(format_table(records), file=out)
    if json_path:
        write_text(json_path, to_json(records))
    return 0 if all(r.passed for r in records) else 1


__all__ = ["CHECKS", "Check", "Record", "format_table", "judge", "main", "run_check", "run_checks", "to_json"]
