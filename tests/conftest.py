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

#: the files that take longest (a minute or more of subprocess runs each), handed out first:
#: xdist's loadfile gives files to the workers in collection order, and these, collected
#: last (tests/test_*.py sort after the folders), made one worker run alone at the end
SLOWEST_FIRST = ("tests/test_compat.py", "tests/test_gpu_tools.py", "tests/test_quickstart.py",
                 "tests/report/test_sweep_report.py", "tests/gate/test_gate.py")


def pytest_collection_modifyitems(session, config, items):
    order = {path: i for i, path in enumerate(SLOWEST_FIRST)}
    items.sort(key=lambda item: order.get(item.nodeid.split("::")[0], len(order)))
