"""What a run leaves behind ends with it: helper processes die with their parent, and every
temporary file of a run lives in one directory that the run removes, or the next run does once
the owner is gone.

A run killed outright (SIGKILL, the OOM killer, a SIGBUS) runs no cleanup of its own: its spawned
parse workers (~100 MB each), their resource tracker and a forked half-parser used to run on, and
its `diag-half-*` and `diag-spill-*` directories (a 307 MB trace's half: 100 MB) stayed in the
temporary directory. Now each helper asks the kernel for SIGKILL when its parent dies (Linux
PR_SET_PDEATHSIG), and the run's directory holds an `owner` file the run keeps locked (flock): the
kernel drops the lock when the owner and every process that inherited it have exited, so the next
run can tell a dead run's directory from a live one without trusting a recycled PID.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import os
import shutil
import signal
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import Any

RUN_PREFIX = "diag-run-"
_OWNER = "owner"
_PR_SET_PDEATHSIG = 1   # <linux/prctl.h>
_current: str | None = None
_stopped_by: int | None = None   # the signal (SIGINT, SIGTERM) that is ending this run, once one came


def die_with_parent(parent_pid: int) -> None:
    """In a helper process: be killed when `parent_pid` dies (Linux; elsewhere the parent's
    cleanup and the next run's sweep are what is left), and leave Ctrl-C to the parent, which
    ends the helpers itself (else every worker prints its own KeyboardInterrupt traceback)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent_pid:   # it died before the request was in place
        os._exit(1)


def scratch_dir() -> str | None:
    """The running ingest's directory for temporary files (None outside a run: the system's)."""
    return _current


@contextlib.contextmanager
def run_dir(parent: str | None = None) -> Iterator[str]:
    """A directory for this run's temporary files under `parent` (default: the system's temporary
    directory), removed at the end; first, the directories of runs whose owner is gone are removed.
    SIGTERM ends the run through this cleanup (exit 143) instead of skipping it; either signal is
    remembered (stopped_by)."""
    global _current
    base = parent or tempfile.gettempdir()
    os.makedirs(base, exist_ok=True)
    sweep(base)
    path = tempfile.mkdtemp(prefix=f"{RUN_PREFIX}{os.getpid()}-", dir=base)
    # Locked under a temporary name, then renamed: a sweep never sees an owner file not yet locked.
    fd = os.open(os.path.join(path, _OWNER + ".new"), os.O_CREAT | os.O_WRONLY, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.write(fd, f"{os.getpid()}\n".encode())
    os.rename(os.path.join(path, _OWNER + ".new"), os.path.join(path, _OWNER))
    before, _current = _current, path
    try:
        with _terminate_as_exit():
            yield path
    finally:
        _current = before
        shutil.rmtree(path, ignore_errors=True)
        os.close(fd)


def sweep(base: str) -> list[str]:
    """Remove the run directories under `base` whose owner has exited; returns them."""
    removed = []
    for d in sorted(Path(base).glob(RUN_PREFIX + "*")):
        try:
            fd = os.open(d / _OWNER, os.O_RDONLY)
        except OSError:
            continue   # not (yet) owned, or not ours to read
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            continue   # its owner (or a helper it started) is still running
        finally:
            os.close(fd)
        shutil.rmtree(d, ignore_errors=True)
        removed.append(str(d))
    return removed


def stopped_by() -> int | None:
    """The signal that is ending this run, if one came while a run directory was held.

    DuckDB checks for signals while it runs a query and answers one by interrupting the query with
    an error of its own ("Query interrupted"): the KeyboardInterrupt or SystemExit the handler
    raised is gone, and a file's write looked like a bad file (left out, the run went on and exited
    0; issue 40, item 1). Whoever catches errors broadly asks this first."""
    return _stopped_by


def raise_if_stopped() -> None:
    """Raise again what the signal's handler raised, if a signal is ending the run."""
    if _stopped_by == signal.SIGINT:
        raise KeyboardInterrupt
    if _stopped_by is not None:
        raise SystemExit(128 + _stopped_by)


@contextlib.contextmanager
def _terminate_as_exit() -> Iterator[None]:
    """SIGTERM's default action ends the process on the spot; as SystemExit it runs the `finally`
    blocks that end the workers and remove the run directory. Both it and SIGINT (still a
    KeyboardInterrupt) are remembered, for stopped_by. Only the main thread can set handlers, and
    only where nobody else has."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    handlers: dict[int, Any] = {}   # signal → the handler to put back
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        handlers[signal.SIGTERM] = signal.SIG_DFL
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        handlers[signal.SIGINT] = signal.default_int_handler

    def stop(signum: int, frame: FrameType | None) -> None:
        global _stopped_by
        _stopped_by = signum
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        raise SystemExit(128 + signum)

    global _stopped_by
    _stopped_by = None   # a run before this one in the process (a library's caller, a test) was stopped
    for signum in handlers:
        signal.signal(signum, stop)
    try:
        yield
    finally:
        for signum, before in handlers.items():
            signal.signal(signum, before)
