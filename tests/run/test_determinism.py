"""``--deterministic`` says whether a run's bits can repeat (issue 55): every op without a
deterministic kernel that warned is recorded, and the strict mode tests use ends a run at
such an op instead. ``put_`` (accumulate=False) has no deterministic kernel on CPU either;
each case runs in a fresh interpreter (the switches are process-wide)."""

from __future__ import annotations

import subprocess
import sys

SCRIPT = """
import torch
from suite.run.determinism import NONDETERMINISTIC, make_kernels_deterministic
make_kernels_deterministic()
for _ in range(2):
    torch.zeros(4).put_(torch.tensor([0, 0]), torch.tensor([1.0, 2.0]), accumulate=False)
print(NONDETERMINISTIC.seen)
"""


def run(env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                          env=env, timeout=120)


def test_an_op_without_a_deterministic_kernel_is_recorded_once_and_still_warns():
    import os

    env = {k: v for k, v in os.environ.items() if k != "PRUNEX_STRICT_DETERMINISM"}
    proc = run(env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "['put_']"
    assert "put_ does not have a deterministic implementation" in proc.stderr


def test_the_strict_mode_ends_at_such_an_op():
    import os

    proc = run({**os.environ, "PRUNEX_STRICT_DETERMINISM": "1"})
    assert proc.returncode == 1
    assert "RuntimeError: put_ does not have a deterministic implementation" in proc.stderr
