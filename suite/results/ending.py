"""How a run that did not finish ended: one record, ``Ending`` (failed or interrupted, and the
one line why), which every writer of such an ending makes (a rank that stopped, a rank's
watchdog, the launcher, ``bench recover``) and ``RunFolder.record_ending`` writes, so that
one rule decides the status and one function writes it. A finished run's summary is
``suite.results.finish``'s."""

from __future__ import annotations

from dataclasses import dataclass

from suite.results.schema import Status

#: how a reason says the run was interrupted: it begins with the status's word, as ranks and
#: launchers write it (``interrupted by SIGTERM``, ``interrupted by a peer``)
INTERRUPTED_BY = Status.INTERRUPTED.value


@dataclass(frozen=True)
class Ending:
    """Why a run stopped before it finished.

    Attributes:
        status: ``Status.FAILED`` or ``Status.INTERRUPTED``.
        reason: one line, the summary's ``error``.
    """

    status: Status
    reason: str

    @classmethod
    def of(cls, reason: str, *, interrupted: bool = False) -> Ending:
        """The ending ``reason`` gives: interrupted where said so, or where the reason says
        the run was (a rank's ``interrupted by SIGTERM``), else failed."""
        stopped = interrupted or reason.startswith(INTERRUPTED_BY)
        return cls(Status.INTERRUPTED if stopped else Status.FAILED, reason)

    @property
    def interrupted(self) -> bool:
        return self.status == Status.INTERRUPTED
