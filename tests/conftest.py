"""Tests rely on CPU semantics (bitwise equality with references recorded on CPU ranks,
gloo's completion order), so a test session hides CUDA from itself and from every process it
starts, before anything reads the environment: on a GPU host ``bench run --device auto`` in a
test still means CPU ranks. ``nox -s gpu`` sets ``PRUNEX_GPU_TESTS=1`` and selects the tests
marked ``gpu``; only then are the devices visible (and those tests skip without them)."""

from __future__ import annotations

import os

GPU_SESSION = os.environ.get("PRUNEX_GPU_TESTS") == "1"

if not GPU_SESSION:
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
