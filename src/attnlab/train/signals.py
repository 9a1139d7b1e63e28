"""Ctrl-C and SIGTERM while training: the first one asks the loop to stop, a second one stops it at once.

The handler only sets a flag, ``requested``; the loop reads it at the step boundaries (under DDP the ranks vote on
it with each step's loss, so that all of them stop after the same step). A second signal raises KeyboardInterrupt
where the loop is, except inside :meth:`StopSignals.uninterruptible` (the optimizer update and the step counter,
which must land whole): there it only repeats the request, and the loop stops at the end of that step.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable

__all__ = ["StopSignals"]

STOPPING = "stopping after this step and saving a checkpoint (press Ctrl-C again to stop at once)"


class StopSignals:
    """SIGINT / SIGTERM handlers for one launch: ``with StopSignals(say) as stop: ... stop.requested ...``.

    Installed only in the main thread (Python delivers signals there alone); ``say`` prints the one-line notice.
    """

    def __init__(self, say: Callable[[str], None] = lambda text: None):
        self.requested = False
        self.say = say
        self._held = False  # inside uninterruptible(): a second signal does not raise
        self._previous = {}

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._previous[sig] = signal.signal(sig, self._on_signal)
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}

    def _on_signal(self, signum, frame) -> None:
        if self.requested and not self._held:
            raise KeyboardInterrupt
        if not self.requested:
            self.say(STOPPING)
        self.requested = True

    @contextlib.contextmanager
    def uninterruptible(self):
        """A block a second signal does not break into (it is still a request to stop after this step)."""
        self._held = True
        try:
            yield
        finally:
            self._held = False
