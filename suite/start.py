"""``bench``'s entry point: the signal handling of its first seconds (``suite.startup_signals``),
then the command line, whose imports take seconds."""

from __future__ import annotations

from suite import startup_signals


def main():
    startup_signals.deferring()
    from suite.cli import main as command_line  # after the handlers: torch's import is long

    return command_line()
