"""How ``bench report``, ``bench compare`` and ``bench trend --add`` scale with the runs of a
result set (issue 46: a year of nightlies is 4,000-12,000 run folders).

A set of N runs is N copies of the committed reference runs (``reference/*/*``, every
machine class's), each a real run folder (every file copied) with its own run id and seed, so
the copies of one reference run are repeats of one configuration, as a year of nightlies is.
The sets grow in place (100, then 900 more, ...), under a temporary folder that is deleted at
the end (``--work`` puts it elsewhere, ``--keep`` keeps it). Each command runs once per N as a
user runs it (a fresh interpreter; ``bench compare`` against the references themselves,
``bench trend`` into an empty history); its wall seconds, its peak resident memory (the
child's ``ru_maxrss`` from ``os.wait4``) and the 1-minute load average before it starts are
written to a Markdown table, with the growth of each command's time between the two largest N.

    python benchmarks/report_scale.py                       # N = 100, 1,000, 10,000
    python benchmarks/report_scale.py --runs 100,1000 -o /tmp/scale.md
    python benchmarks/report_scale.py --smoke               # N = 12, 24, into a temporary folder

Copying 10,000 runs writes about 1.3 GB and takes a few minutes; the load average says what
else the machine was doing (timings from a busy machine are upper bounds).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from suite.api import schema

REPO = Path(__file__).resolve().parents[1]
REFERENCE = REPO / "reference"
DEFAULT_OUT = REPO / "benchmarks" / "measured" / "report_scale.md"
COMMANDS = ("report", "compare", "trend")
#: --smoke: two small sets, every command once each
SMOKE_RUNS = "12,24"
#: what follows this line in the output file is kept when the table is measured again
NOTES = "<!-- notes: kept as they are when report_scale.py writes the table again -->"


@dataclass
class Timing:
    runs: int
    command: str
    seconds: float
    peak_mb: float
    code: int
    load_before: float


def reference_runs(reference: Path) -> list[Path]:
    """Every finished run folder under ``reference`` (its machine-class folders), sorted."""
    runs = []
    for summary in sorted(reference.rglob("summary.json")):
        if json.loads(summary.read_text()).get(schema.STATUS) == schema.Status.OK:
            runs.append(summary.parent)
    if not runs:
        raise SystemExit(f"no finished run folders under {reference}")
    return runs


def copy_run(source: Path, target: Path, copy: int) -> None:
    """``source`` as a new run folder ``target``: every file copied, its run id the folder's
    name and its seed ``copy`` (in the summary and in the manifest's configuration)."""
    shutil.copytree(source, target)
    run_id = target.name
    summary = json.loads((target / "summary.json").read_text())
    summary.update({schema.RUN_ID: run_id, schema.SEED: copy})
    (target / "summary.json").write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
    manifest_path = target / "manifest.json"
    if manifest_path.exists():
        manifest = json.loads(manifest_path.read_text())
        manifest[schema.RUN_ID] = run_id
        manifest.setdefault(schema.CONFIG, {})[schema.SEED] = copy
        manifest[schema.CONFIG][schema.RUN_ID] = run_id
        manifest_path.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")


def grow(root: Path, sources: list[Path], have: int, want: int) -> None:
    """Add copies ``have`` .. ``want - 1`` to ``root``: copy i is of ``sources[i % len]``,
    the ``i // len``-th of that run, kept in its machine class's folder."""
    for i in range(have, want):
        source = sources[i % len(sources)]
        copy = i // len(sources)
        copy_run(source, root / source.parent.name / f"{source.name}-c{copy:05d}", copy)


def timed(command: list[str], stdout) -> tuple[float, float, int]:
    """(wall seconds, peak resident MB, exit code) of ``command`` in a new process."""
    env = {**os.environ, "PRUNEX_PROGRESS": "0"}
    begin = time.perf_counter()
    proc = subprocess.Popen(command, stdout=stdout, stderr=subprocess.PIPE, env=env)
    stderr = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - begin
    proc.returncode = os.waitstatus_to_exitcode(status)
    proc.stderr.close()
    if proc.returncode not in (0, 1):
        raise SystemExit(f"{' '.join(command)} exited {proc.returncode}:\n{stderr.decode()}")
    return seconds, usage.ru_maxrss / 1024, proc.returncode  # ru_maxrss: KiB on Linux


def measure(runs: int, root: Path, scratch: Path, reference: Path, commands) -> list[Timing]:
    bench = [sys.executable, "-m", "suite.cli"]
    argv = {
        "report": [*bench, "report", str(root), "-o", str(scratch / f"report-{runs}")],
        "compare": [*bench, "compare", str(reference), str(root)],
        "trend": [*bench, "trend", str(scratch / f"history-{runs}.jsonl"), "--add", str(root)],
    }
    timings = []
    for command in commands:
        load = os.getloadavg()[0]
        with (scratch / f"{command}-{runs}.out").open("w") as out:
            seconds, peak, code = timed(argv[command], out)
        timings.append(Timing(runs, command, seconds, peak, code, load))
        print(f"{runs} runs: bench {command}: {seconds:.1f} s, {peak:.0f} MB peak, exit {code}, "
              f"load {load:.2f}", file=sys.stderr, flush=True)
    return timings


def commit() -> str:
    """The checkout's commit (``-`` outside git)."""
    proc = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, text=True,
                          capture_output=True)
    return proc.stdout.strip() or "-"


def table(timings: list[Timing], argv: list[str]) -> str:
    """The Markdown note: every timing, and each command's growth between the two largest N."""
    lines = [
        "# `bench report`, `bench compare`, `bench trend --add` against the runs in a set",
        "",
        f"`{' '.join(['python benchmarks/report_scale.py', *argv])}` at commit {commit()} "
        f"on {platform.node()} "
        f"({os.cpu_count()} CPUs, Python {platform.python_version()}), "
        f"{time.strftime('%Y-%m-%d %H:%M')}. Copies of the committed reference runs "
        "(distinct run ids and seeds); each command once, in a fresh interpreter; `load` is "
        "the 1-minute load average just before the command started (this machine has "
        f"{os.cpu_count()} CPUs: a load above that means other work shared them).",
        "",
        "| runs | command | wall (s) | peak memory (MB) | exit | load |",
        "|---:|---|---:|---:|---:|---:|",
    ]
    for t in timings:
        lines.append(f"| {t.runs:,} | `bench {t.command}` | {t.seconds:.1f} | {t.peak_mb:.0f} "
                     f"| {t.code} | {t.load_before:.2f} |")
    sizes = sorted({t.runs for t in timings})
    if len(sizes) >= 2:
        small, large = sizes[-2], sizes[-1]
        lines += ["", f"Growth of the wall time from {small:,} to {large:,} runs "
                  f"({large / small:g}x the runs):", ""]
        for command in dict.fromkeys(t.command for t in timings):
            by_size = {t.runs: t.seconds for t in timings if t.command == command}
            lines.append(f"- `bench {command}`: {by_size[large] / by_size[small]:.2f}x")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", default="100,1000,10000",
                        help="the set sizes, comma separated, increasing")
    parser.add_argument("--commands", default=",".join(COMMANDS),
                        help=f"which to time, of {', '.join(COMMANDS)}")
    parser.add_argument("--reference", default=str(REFERENCE),
                        help="the runs copied (and the baseline of bench compare)")
    parser.add_argument("--work", default=None,
                        help="where the copies go (default: a new temporary folder)")
    parser.add_argument("--keep", action="store_true", help="keep the copies and outputs")
    parser.add_argument("-o", "--output", default=None,
                        help=f"the Markdown table (default: {DEFAULT_OUT.relative_to(REPO)}; "
                        "--smoke: in the work folder)")
    parser.add_argument("--smoke", action="store_true",
                        help=f"sets of {SMOKE_RUNS} runs (unless --runs is given)")
    args = parser.parse_args()
    if args.smoke and "--runs" not in " ".join(sys.argv[1:]):
        args.runs = SMOKE_RUNS
    sizes = [int(n) for n in args.runs.split(",")]
    commands = [c for c in args.commands.split(",") if c]
    if sizes != sorted(sizes) or sizes[0] < 1 or set(commands) - set(COMMANDS):
        parser.error("--runs must increase from 1 up; --commands must name "
                     f"{', '.join(COMMANDS)}")
    reference = Path(args.reference)
    sources = reference_runs(reference)
    work = Path(args.work or tempfile.mkdtemp(prefix="report-scale-"))
    root, scratch = work / "runs", work / "outputs"
    if root.exists():
        parser.error(f"{root} exists (copies of an earlier measurement?); give another --work")
    scratch.mkdir(parents=True, exist_ok=True)
    output = Path(args.output) if args.output else (
        work / "report_scale.md" if args.smoke else DEFAULT_OUT)
    timings, have = [], 0
    try:
        for runs in sizes:
            begin = time.perf_counter()
            grow(root, sources, have, runs)
            print(f"{runs} runs copied ({time.perf_counter() - begin:.0f} s)", file=sys.stderr,
                  flush=True)
            have = runs
            timings += measure(runs, root, scratch, reference, commands)
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
            shutil.rmtree(scratch, ignore_errors=True)
    note = table(timings, sys.argv[1:])
    output.parent.mkdir(parents=True, exist_ok=True)
    kept = output.read_text().partition(NOTES)[2] if output.exists() else ""
    output.write_text(note + (f"\n{NOTES}{kept}" if kept else ""))
    if args.work is None and not args.keep and not any(work.iterdir()):
        work.rmdir()  # the temporary folder this run made, now empty
    print(note)


if __name__ == "__main__":
    main()
