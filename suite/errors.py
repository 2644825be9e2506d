"""The exceptions the CLI prints as one line: what the user gave wrong (exit 2), and a run
that started and failed (exit 1); the bound on what a line may quote, and an OS error in
words."""

import os

#: the most characters of a value a line quotes, and of a line the CLI prints
QUOTE_LIMIT = 120
LINE_LIMIT = 2000


def os_reason(exc: OSError) -> str:
    """``no space left on device``: an OSError's reason in words."""
    if exc.errno is not None:
        return os.strerror(exc.errno).lower()
    return str(exc).splitlines()[0][:120] if str(exc) else type(exc).__name__


def clipped(text, limit: int = QUOTE_LIMIT) -> str:
    """``text`` cut to ``limit`` characters, saying how many were left out: a value from a
    file, a folder's name or an exception may be of any length, a line that names it may not.
    """
    text = str(text)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text) - limit} more)"


def one_line(text, limit: int = LINE_LIMIT) -> str:
    """``text`` as one bounded line: line breaks as ``" / "``, cut at ``limit``."""
    return clipped(" / ".join(part for part in str(text).splitlines() if part.strip()), limit)


class BenchError(Exception):
    """Bad input or environment: the message names the bad value and what would work. The
    command line prints it as one line (exit 2 before any rank starts; a failed run after).

    Examples:
        ```python
        if ctx.topology.num_nodes < 2:
            raise BenchError("efsign needs two nodes; use --gpus-per-node")
        ```
    """


class RunFailed(BenchError):
    """A run started and then failed or was interrupted; its folder keeps what it recorded."""


class RunInterrupted(RunFailed):
    """A signal stopped the run (Ctrl-C, SIGTERM from a scheduler); a sweep stops too."""
