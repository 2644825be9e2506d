"""The docs' Quickstart on a fresh clone: its report holds exactly the runs the user made.

A fresh clone is what git would check out of this tree (tracked files and new ones it does
not ignore), copied to an empty folder; the Quickstart's command lines are read from the
docs' home page and run there as written, with a tiny budget added, under that copy's code.
The committed references must not reach the user's report (issue 44: they were pooled with
the user's two runs as repeats of other machine classes)."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[1]
#: added to each `bench run` of the Quickstart: a few local steps of one round
TINY_BUDGET = ["--epochs", "0.01", "--eval-every", "1000"]


def quickstart_commands() -> list[list[str]]:
    """The `bench` lines of docs/index.md's Quickstart block, comments dropped."""
    page = (ROOT / "docs" / "index.md").read_text()
    section = page.split("## Quickstart", 1)[1]
    block = re.search(r"```bash\n(.*?)```", section, re.S).group(1)
    return [shlex.split(line.split("#", 1)[0]) for line in block.splitlines()
            if line.strip().startswith("bench ")]


def fresh_clone(target: Path) -> Path:
    """The files a clone of this tree holds (tracked, and untracked but not ignored)."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT, capture_output=True, check=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        source = ROOT / name
        if source.is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)
    return target


@pytest.mark.slow
@pytest.mark.integration  # a minute of end-to-end runs: nox -s integration
def test_the_quickstart_report_holds_exactly_the_users_runs(tmp_path):
    clone = fresh_clone(tmp_path / "clone")
    assert not [p for p in (clone / "results").iterdir() if p.name != ".gitkeep"]
    env = {**os.environ, "PYTHONPATH": str(clone), "PRUNEX_PROGRESS": "0"}
    commands = quickstart_commands()
    assert [c[:2] for c in commands] == [["bench", "run"], ["bench", "run"],
                                         ["bench", "report"]]
    made = []
    for words in commands:
        args = words[1:] + (TINY_BUDGET if words[1] == "run" else [])
        proc = subprocess.run([sys.executable, "-m", "suite.cli", *args], cwd=clone, env=env,
                              capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-2000:]
        if words[1] == "run":
            made.append(Path(proc.stdout.strip().splitlines()[-1].split()[-1]).name)
    report = clone / commands[-1][commands[-1].index("-o") + 1]
    runs = pd.read_csv(report / "runs.csv")
    assert sorted(runs.run_id) == sorted(made) and len(made) == 2
    assert sorted(runs.method) == ["ddp", "prunex"]
    summary = pd.read_csv(report / "summary.csv")
    assert len(summary) == 2 and (summary.repeats == 1).all()
    assert (report / "report.md").read_text().count("2 runs.") == 1
