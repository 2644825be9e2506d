"""SIGINT and SIGTERM from the moment ``bench`` starts until its ranks' launcher takes them
(``suite.launchers.local.LauncherSignals``).

While ``bench`` imports torch (seconds), a KeyboardInterrupt raised inside an import of a
C++ extension aborts the process (``terminate called after throwing ...``), and a default
SIGTERM kills it silently. So the first handler only records the signal (``deferring``); once
the imports are done ``armed`` turns a recorded or later signal into ``Interrupted`` at the
next Python line, which the command line reports in one line, exit 130. Light on purpose: no
torch, imported first by ``suite.cli``.
"""

from __future__ import annotations

import signal

HANDLED = (signal.SIGINT, signal.SIGTERM)
#: the exit code of a command interrupted before any rank started (128 + SIGINT, as a shell)
INTERRUPTED_EXIT = 130

_received: list[int] = []
_runs_started: list[str] = []  # run folders this command opened (a sweep's cells)


class Interrupted(KeyboardInterrupt):
    """A SIGINT or SIGTERM before the ranks' launcher took the signals over."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.name = signal.Signals(signum).name


def _record(signum, _frame) -> None:
    _received.append(signum)


def _raise(signum, _frame) -> None:
    _received.append(signum)
    raise Interrupted(signum)


def deferring() -> None:
    """Record SIGINT and SIGTERM without raising (the imports are under way). An ignored
    signal (a background job's SIGINT) stays ignored."""
    for sig in HANDLED:
        if signal.getsignal(sig) is not signal.SIG_IGN:
            signal.signal(sig, _record)


def armed() -> None:
    """Raise ``Interrupted`` for a signal recorded during the imports, and for any later one
    until the launcher installs its own handlers."""
    for sig in HANDLED:
        if signal.getsignal(sig) is _record:
            signal.signal(sig, _raise)
    if _received:
        raise Interrupted(_received[0])


def run_started(folder: str) -> None:
    """A launcher opened a run folder: an interruption from here on is the run's to record."""
    _runs_started.append(folder)


def kept() -> str:
    """What an interruption before the ranks leaves: nothing, or the runs already done."""
    if not _runs_started:
        return "nothing was run"
    return f"the {len(_runs_started)} run(s) started before are kept as they ended"
