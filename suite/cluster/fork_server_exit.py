"""Imported last by the ranks' fork server (``suite.cluster.ranks.RANK_MODULES``) so that the
server ends the moment its launcher is gone. It only forks ranks and holds nothing to flush,
yet tearing down the interpreter that imported torch, timm and pandas takes it a second or
more of CPU, during which it outlived its launcher (a SLURM job's step, a test's run).

A rank the launcher stops while the server is still forking it (a Ctrl-C in the second a
run starts) fails to unpickle its process object, whose semaphore the launcher has already
released; multiprocessing prints that knock-on as a traceback under the run's one line. The
server's ranks end such a start quietly (``quiet_stopped_start``); any other error in a rank's
start is printed as before.

The server freezes what it imported (``gc.freeze``) so its ranks share those pages.

Only the fork server's own interpreter is affected: elsewhere importing this does nothing.
"""

from __future__ import annotations

import atexit
import gc
import os
import sys
import traceback

#: the command line multiprocessing starts its fork server with
FORK_SERVER_COMMAND = "from multiprocessing.forkserver import main"

if any(FORK_SERVER_COMMAND in arg for arg in getattr(sys, "orig_argv", ())):
    atexit.register(os._exit, 0)  # runs first (last registered): skips the teardown


def quiet_stopped_start(kind, value, trace, _print=sys.excepthook) -> None:
    """sys.excepthook of the server's children: silent for a start whose launcher is gone
    (the process object's resources missing while multiprocessing unpickles it)."""
    starting = any(frame.name == "_main" and frame.filename.endswith("spawn.py")
                   for frame in traceback.extract_tb(trace))
    if starting and isinstance(value, FileNotFoundError | EOFError | ConnectionError):
        return
    _print(kind, value, trace)


if any(FORK_SERVER_COMMAND in arg for arg in getattr(sys, "orig_argv", ())):
    sys.excepthook = quiet_stopped_start
    # every object the server imported moves to the collector's permanent generation: a
    # rank's collector never scans them, so it never writes their headers, and the pages
    # that hold them stay shared between the server and its ranks (copy-on-write) instead
    # of being copied into every rank (the fork-server pattern of CPython's gc.freeze docs)
    gc.freeze()
