"""One exception type for problems the user can fix; the CLI prints it as one line."""


class BenchError(Exception):
    """Bad input or environment: the message names the bad value and what would work."""
