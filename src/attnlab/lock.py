"""One writer per directory: an advisory, non-blocking lock on ``<dir>/.lock``.

Two ``attnlab train`` processes resuming the same run directory, or two ``attnlab compare`` commands on the same
``out_dir``, would both append to the same metrics.jsonl and overwrite each other's checkpoints. Each takes this
lock first; the second one stops with a one-line error naming the process that holds it.

The lock is ``fcntl.flock`` (POSIX): the kernel drops it when the holder exits, however it exits, so a killed
run never leaves a stale lock behind. The file itself stays (empty but for the holder's pid) and is harmless.
Where ``fcntl`` does not exist (Windows) the lock is a no-op.
"""

from __future__ import annotations

import os
from pathlib import Path

from .errors import ConfigError

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None

__all__ = ["DirectoryLock", "LOCK_FILE"]

LOCK_FILE = ".lock"


class DirectoryLock:
    """``with DirectoryLock(path, what="training run"):`` holds ``path/.lock`` (creating ``path``) or raises
    ConfigError. The lock file names the holder ("pid 123 (training run)") for the error of the next comer."""

    def __init__(self, path, what: str = "directory"):
        self.path = Path(path)
        self.what = what
        self._fh = None
        self._created = False

    def acquire(self) -> "DirectoryLock":
        if fcntl is None or self._fh is not None:
            return self
        self._created = not self.path.exists()
        self.path.mkdir(parents=True, exist_ok=True)
        fh = open(self.path / LOCK_FILE, "a+", encoding="utf-8")
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            fh.seek(0)
            holder = fh.read().strip() or "another process"
            fh.close()
            raise ConfigError(
                f"{self.path} is in use by {holder}; wait for it to finish or stop it, or use another directory"
            ) from None
        fh.seek(0)
        fh.truncate()
        fh.write(f"pid {os.getpid()} ({self.what})\n")
        fh.flush()
        self._fh = fh
        return self

    def release(self) -> None:
        """Unlock. A directory this lock created and nothing else wrote to (a run that failed during set-up)
        is removed again; otherwise the lock file stays (unlinking it could let two later comers both lock)."""
        if self._fh is None:
            return
        if self._created and [p.name for p in self.path.iterdir()] == [LOCK_FILE]:
            (self.path / LOCK_FILE).unlink()
            self.path.rmdir()
        fcntl.flock(self._fh.fileno(), fcntl.LOCK_UN)
        self._fh.close()
        self._fh = None

    def __enter__(self) -> "DirectoryLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()
