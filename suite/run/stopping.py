"""Stopping a rank at a safe point when it is asked to (SIGTERM from a scheduler or the
launcher, SIGINT from Ctrl-C).

The first signal only raises a flag: the training loop sees it at the ranks' next agreement
(an all-reduce at most about a second of training apart), and they stop together after the
same iteration, flush their rows (and checkpoint, when checkpointing is on). A second signal
interrupts at once (unless it repeats the first within a few seconds), except while a flush
or a checkpoint is being written: then it waits until that write is whole.
"""

from __future__ import annotations

import signal
import time
from contextlib import contextmanager

HANDLED = (signal.SIGTERM, signal.SIGINT)
#: a repeat within this many seconds is the same request (Ctrl-C reaches every rank directly
#: and again through the launcher), not an insistence
REPEAT_GRACE_SECONDS = 3.0


class StopRequest:
    def __init__(self):
        self.signal: int | None = None
        self._first_at = 0.0
        self._writing = 0
        self._deferred = False

    def install(self) -> StopRequest:
        for sig in HANDLED:
            signal.signal(sig, self._handle)
        return self

    @property
    def requested(self) -> bool:
        return self.signal is not None

    @property
    def name(self) -> str:
        return signal.Signals(self.signal).name if self.signal is not None else "none"

    def _handle(self, signum, _frame) -> None:
        if self.signal is None:
            self.signal, self._first_at = signum, time.monotonic()
        elif time.monotonic() - self._first_at < REPEAT_GRACE_SECONDS:
            return
        elif self._writing:
            self._deferred = True
        else:
            raise KeyboardInterrupt(f"second {signal.Signals(signum).name}")

    @contextmanager
    def held(self):
        """Signals wait while the block writes something that must not be left half done."""
        self._writing += 1
        try:
            yield
        finally:
            self._writing -= 1
            if self._writing == 0 and self._deferred:
                self._deferred = False
                raise KeyboardInterrupt("second signal, held during a write")
