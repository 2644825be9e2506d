"""The exceptions the CLI prints as one line: what the user gave wrong (exit 2), and a run
that started and failed (exit 1)."""


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
