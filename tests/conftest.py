"""Tests rely on CPU semantics (bitwise equality with references recorded on CPU ranks,
gloo's completion order), so a test session hides CUDA from itself and from every process it
starts, before anything reads the environment: on a GPU host ``bench run --device auto`` in a
test still means CPU ranks. ``nox -s gpu`` sets ``PRUNEX_GPU_TESTS=1`` and selects the tests
marked ``gpu``; only then are the devices visible (and those tests skip without them)."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile

GPU_SESSION = os.environ.get("PRUNEX_GPU_TESTS") == "1"

if not GPU_SESSION:
    os.environ["CUDA_VISIBLE_DEVICES"] = ""

# the host's decoded datasets (suite.data.shared) in a folder of this session's, not the
# user's ~/.cache: a test never reads an entry another checkout's code decoded, nor leaves any
if "PRUNEX_DATA_CACHE" not in os.environ:
    os.environ["PRUNEX_DATA_CACHE"] = tempfile.mkdtemp(prefix="prunex-data-cache-")
    atexit.register(shutil.rmtree, os.environ["PRUNEX_DATA_CACHE"], ignore_errors=True)
