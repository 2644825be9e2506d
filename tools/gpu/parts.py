"""The GPU checks, in parts that each fit one 10-minute command on one H100 (a borrowed
machine's call, a CI job's limit). ``tools/gpu/run PART`` runs one on the lent GPU machine
after its offline install; ``nox -s gpu -- --part N`` runs the same where the suite is
installed.

Each part first prints what the numbers depend on (Python, torch, CUDA, NCCL, the device and
its driver, the torch fallbacks in use) and writes its log and a markdown table headed by
them to ``$OUT`` when set (else ``GPU_OUT``, else ``benchmarks/measured`` for the
measurements and ``.gpu/out`` for the rest). Exit 1 when a check failed.

    python tools/gpu/parts.py 0            # smoke: also runs without a GPU
    python tools/gpu/parts.py 1 -- -k span # pytest arguments after --
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import threading
import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from processes import adopt_orphans, stop_descendants, stop_group  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
BENCH = [sys.executable, "-m", "suite.cli"]


@dataclass(frozen=True)
class Part:
    what: str
    minutes: int  # estimated on one H100: process start, CUDA init and data dominate
    needs_gpu: bool = True


PARTS = {
    "0": Part("smoke: ddp, topk and prunex for 3 iterations on 4 ranks as 2 nodes x 2 (sharing "
              "the GPU, or CPU ranks without one), and every torch API the code names checked "
              "against this torch (tools/torch_apis.py)", 2, needs_gpu=False),
    # minutes: parts 1 and 2 as measured on an H200 (benchmarks/measured/gpu_h200_torch2.11:
    # their tests took 104 s and 166 s, plus start-up); 3 and 4 from its sweep cells (8-9 s
    # each, 11 methods), not yet run whole
    "1": Part("tests: every method on CUDA (2 x 2 sharing the GPUs), a hook span that ends at "
              "its collective's completion, Top-K replicas, a GPU folder read without CUDA", 3),
    "2": Part("tests: every method on one NCCL rank, checkpoint and resume on CUDA (twins "
              "first, strict determinism), DDP's all-reduce time against calibrated bandwidth "
              "(4 GPUs)", 5),
    "3": Part("measure: every method, one rank per GPU on NCCL -> gpu_steps_<device>_nccl.md; "
              "exit 1 on a failed or missing method, a backend not NCCL, PowerSGD never "
              "compressing, a phase longer than its iteration", 3),
    "4": Part("measure: every method, 2 x 2 ranks sharing the GPUs -> "
              "gpu_steps_<device>_shared.md, checked as part 3", 3),
}
#: the measuring call of parts 3 and 4 (gpu_steps.py stops its sweep itself before this)
MEASURE_TIMEOUT = 540
#: a test (or a smoke sweep) running longer than this has hung: it fails, the part goes on
TEST_TIMEOUT = 300


def environment() -> dict:
    """What every number of a part depends on, for its log and its table's header."""
    import torch

    from suite import compat
    from suite.results.folder import driver_version, nccl_version

    facts = {"python": platform.python_version(), "torch": torch.__version__,
             "cuda": torch.version.cuda, "nccl": nccl_version(),
             "device": "cpu (no CUDA device)", "driver": None,
             "torch_fallbacks": compat.fallbacks()}
    if torch.cuda.is_available():
        count = torch.cuda.device_count()
        facts["device"] = f"{torch.cuda.get_device_name(0)} x {count}"
        facts["driver"] = driver_version()
    return facts


def header(facts: dict) -> str:
    """The line that heads every table: the card first."""
    return (f"{facts['device']}; torch {facts['torch']}, CUDA {facts['cuda']}, NCCL "
            f"{facts['nccl']}, driver {facts['driver']}, Python {facts['python']}; torch "
            f"fallbacks: {', '.join(facts['torch_fallbacks']) or 'none'}")


def device_slug(facts: dict) -> str:
    return facts["device"].split(" x ")[0].lower().replace(" ", "-")


def run_logged(command: list[str], log: Path, *, env: dict | None = None,
               timeout: float | None = None) -> int:
    """``command`` with its output shown and appended to ``log``; its exit code (124 when it
    ran past ``timeout``). The clock is the caller's, not the output's: a command that
    prints nothing is stopped at ``timeout`` all the same, with its process group and every
    process it started, in whatever session (tools/gpu/processes.py); so are the processes a
    command that ended left running. This process must have no other children."""
    adopt_orphans()
    print(f"$ {' '.join(command)}", flush=True)
    with log.open("a") as out:
        out.write(f"$ {' '.join(command)}\n")
        out.flush()
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, env=env, cwd=REPO, start_new_session=True)
        shown = threading.Thread(target=show, args=(proc.stdout, out), daemon=True)
        shown.start()
        code = wait_or_stop(proc, timeout)
        left = stop_descendants()
        shown.join(timeout=10)  # the pipe ends with the last process holding it
        ending = (f"stopped after {timeout:.0f} s" if code is None else f"exit {code}") + (
            f"; {left} process(es) it left were killed" if left else "")
        out.write(f"[{ending}]\n")
    print(f"[{ending}]", flush=True)
    return 124 if code is None else code


def wait_or_stop(proc: subprocess.Popen, timeout: float | None) -> int | None:
    """``proc``'s exit code, or None when it ran past ``timeout`` and its process group was
    killed. Its group is a session of its own, which a terminal's Ctrl-C does not reach: on
    one here the group and whatever it started are stopped before the interrupt goes on."""
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        stop_group(proc.pid)
        proc.wait()
        return None
    except KeyboardInterrupt:
        stop_group(proc.pid)
        proc.wait()
        stop_descendants()
        raise


def show(lines, log) -> None:
    """Copy a command's output to the terminal and its log, line by line, as it comes."""
    for line in lines:
        print(line, end="", flush=True)
        log.write(line)
        log.flush()


# -- part 0: the smoke ------------------------------------------------------------------------
SMOKE_METHODS = "ddp,topk,prunex"


def smoke(out: Path, facts: dict) -> int:
    import pandas as pd
    import torch

    log = out / "part0.log"
    code = run_logged([sys.executable, "tools/torch_apis.py"], log)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    results = Path(tempfile.mkdtemp(prefix="prunex-smoke-"))  # $OUT takes a few files only
    swept = run_logged([*BENCH, "sweep", "--method", SMOKE_METHODS, "--workload", "cnn-fmnist",
                        "--dataset", "synthetic", "--synthetic-size", "512,128", "--batch-size",
                        "32", "--gpus", "4", "--gpus-per-node", "2", "--iterations", "3",
                        "--local-steps", "2", "--device", device, "--results-dir", str(results),
                        "--force"],
                       log, env={**os.environ, "PRUNEX_PROGRESS": "0"}, timeout=TEST_TIMEOUT)
    rows = []
    for summary_file in sorted(results.rglob("summary.json")):
        summary = json.loads(summary_file.read_text())
        manifest_file = summary_file.with_name("manifest.json")
        manifest = json.loads(manifest_file.read_text()) if manifest_file.exists() else {}
        rows.append({"method": summary.get("method"), "status": summary.get("status"),
                     "device": manifest.get("device"), "backend": manifest.get("backend"),
                     "iterations": summary.get("iterations"),
                     "s/iteration": summary.get("iteration_seconds"),
                     "first iteration s": summary.get("first_iteration_seconds"),
                     "warm-up s": summary.get("warmup_seconds"),
                     "final train loss": summary.get("final_train_loss"),
                     "error": summary.get("error")})
    table = pd.DataFrame(rows)
    ok = swept == 0 and len(rows) == 3 and (table["status"] == "ok").all()
    write_table(out / "part0.md", "Part 0: smoke", facts, [
        f"`bench sweep --method {SMOKE_METHODS}` on 4 ranks as 2 x 2, `--device {device}`, "
        "3 iterations of 2 local steps on synthetic data; the torch API check exited "
        f"{code}.", "", table.to_markdown(index=False, floatfmt=".4g") if rows else "no run"])
    return 0 if ok and code == 0 else 1


# -- parts 1 and 2: the GPU tests -------------------------------------------------------------
TESTS = {"1": "tests/gpu/test_part1_every_method.py", "2": "tests/gpu/test_part2_nccl.py"}


def gpu_tests(part: str, out: Path, facts: dict, pytest_args: list[str]) -> int:
    junit = out / f"part{part}.xml"
    command = [sys.executable, "-m", "pytest", "-q", "-m", "gpu", "-rs", "-p", "no:cacheprovider",
               f"--timeout={TEST_TIMEOUT}", f"--junitxml={junit}", TESTS[part], *pytest_args]
    code = run_logged(command, out / f"part{part}.log",
                      env={**os.environ, "PRUNEX_GPU_TESTS": "1"})
    rows = []
    if junit.exists():
        for case in ElementTree.parse(junit).iter("testcase"):
            outcome = next((child.tag for child in case if child.tag in
                            ("failure", "error", "skipped")), "passed")
            detail = next((child.get("message", "") for child in case
                           if child.tag in ("failure", "error", "skipped")), "")
            rows.append(f"| {case.get('name')} | {outcome} | {float(case.get('time', 0)):.1f} "
                        f"| {detail.splitlines()[0][:160] if detail else ''} |")
    write_table(out / f"part{part}.md", f"Part {part}: {PARTS[part].what}", facts, [
        "| test | outcome | seconds | message |", "|---|---|---|---|", *rows])
    return 0 if code == 0 else 1  # 5: no test ran, which is no pass


# -- parts 3 and 4: the measurements ----------------------------------------------------------
def measure(part: str, out: Path, facts: dict) -> int:
    layout = {"3": "nccl", "4": "shared"}[part]
    table = out / f"gpu_steps_{device_slug(facts)}_{layout}.md"
    code = run_logged([sys.executable, "benchmarks/gpu_steps.py", "--layout", layout, "-o",
                       str(table)], out / f"part{part}.log",
                      env={**os.environ, "PRUNEX_GPU_TESTS": "1"}, timeout=MEASURE_TIMEOUT)
    if table.exists():  # its own title names the card; the versions go under it
        lines = table.read_text().splitlines()
        table.write_text("\n".join([lines[0], "", header(facts), *lines[1:]]) + "\n")
    return code


def write_table(path: Path, title: str, facts: dict, body: list[str]) -> None:
    path.write_text("\n".join([f"# {title}", "", header(facts), "", *body]) + "\n")
    print(path.read_text())


def output_folder(part: str) -> Path:
    chosen = os.environ.get("OUT") or os.environ.get("GPU_OUT")
    if not chosen:
        chosen = "benchmarks/measured" if part in ("3", "4") else ".gpu/out"
    path = Path(chosen)
    path.mkdir(parents=True, exist_ok=True)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("part", choices=list(PARTS), help="; ".join(
        f"{k}: {p.what} (about {p.minutes} min)" for k, p in PARTS.items()))
    parser.add_argument("pytest_args", nargs="*", help="after --: passed to pytest (parts 1, 2)")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(REPO))
    import torch

    part = PARTS[args.part]
    if part.needs_gpu and not torch.cuda.is_available():
        print(f"Error: part {args.part} needs a CUDA device (part 0 runs without)",
              file=sys.stderr)
        return 2
    facts = environment()
    out = output_folder(args.part)
    print(f"part {args.part}: {part.what} (about {part.minutes} min)\n{header(facts)}",
          flush=True)
    (out / "environment.json").write_text(json.dumps(facts, indent=1) + "\n")
    if args.part == "0":
        return smoke(out, facts)
    if args.part in TESTS:
        return gpu_tests(args.part, out, facts, args.pytest_args)
    return measure(args.part, out, facts)


if __name__ == "__main__":
    sys.exit(main())
