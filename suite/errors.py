"""The exceptions the CLI prints as one line: what the user gave wrong (exit 2), and a run
that started and failed (exit 1)."""


class BenchError(Exception):
    """Bad input or environment: the message names the bad value and what would work."""


class RunFailed(BenchError):
    """A run started and then failed or was interrupted; its folder keeps what it recorded."""


class RunInterrupted(RunFailed):
    """A signal stopped the run (Ctrl-C, SIGTERM from a scheduler); a sweep stops too."""
