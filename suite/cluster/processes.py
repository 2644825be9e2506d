"""Whether a recorded process is still running (run folders and emulated namespaces record
their owners' pids, so leftovers can be told from live runs)."""

from __future__ import annotations

import os
from pathlib import Path


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def python_alive(pid: int) -> bool:
    """Alive and a Python process (a recycled pid of something else does not count)."""
    if not pid_alive(pid):
        return False
    try:
        return b"python" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return True
