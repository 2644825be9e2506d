"""Imported last by the ranks' fork server (``suite.cluster.ranks.RANK_MODULES``) so that the
server ends the moment its launcher is gone. It only forks ranks and holds nothing to flush,
yet tearing down the interpreter that imported torch, timm and pandas takes it a second or
more of CPU, during which it outlived its launcher (a SLURM job's step, a test's run).

Only the fork server's own interpreter is affected: elsewhere importing this does nothing.
"""

from __future__ import annotations

import atexit
import os
import sys

#: the command line multiprocessing starts its fork server with
FORK_SERVER_COMMAND = "from multiprocessing.forkserver import main"

if any(FORK_SERVER_COMMAND in arg for arg in getattr(sys, "orig_argv", ())):
    atexit.register(os._exit, 0)  # runs first (last registered): skips the teardown
