"""Run folders under a results directory, read once, with their tables on demand."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import pandas as pd

from suite.cluster import phases
from suite.errors import BenchError
from suite.results.folder import MANIFEST, SUMMARY, RunFolder, setting_of


@dataclass
class Run:
    folder: Path
    summary: dict
    manifest: dict = field(default_factory=dict)
    unreadable: list[str] = field(default_factory=list)  # files left out, with the reason

    @property
    def run_id(self) -> str:
        return self.summary.get("run_id") or self.folder.name

    @property
    def simulated(self) -> bool:
        return bool(self.summary.get("simulated"))

    @property
    def setting(self) -> str:
        """Where the run's times come from, unless a plain run: `` (sim PROFILE)`` or
        `` (emulated RATE)``. Runs of different settings never share a line or a label."""
        setting = setting_of(self.summary, self.manifest)
        return "" if setting == "real" else f" ({setting})"

    @property
    def label(self) -> str:
        """method, GPUs, the options that were set, and the setting."""
        s = self.summary
        options = ",".join(
            f"{k.replace('_', '-')}={v}" for k, v in sorted((s.get("options") or {}).items())
        )
        text = f"{s['method']} {s['gpus']}g" + (f" [{options}]" if options else "")
        return text + self.setting

    @property
    def method(self) -> str:
        return self.summary["method"]

    @property
    def ranks_word(self) -> str:
        """ "GPUs" when the ranks ran on CUDA devices, else "ranks"."""
        return "GPUs" if str(self.manifest.get("device", "")).startswith("cuda") else "ranks"

    @property
    def display_parts(self) -> dict[str, str]:
        """The pieces of a figure label: method, options, ranks, setting."""
        from suite.report.style import method_style, options_text

        return {
            "method": method_style(self.method).name,
            "options": options_text(self.summary.get("options")),
            "ranks": f"{self.summary['gpus']} {self.ranks_word}",
            "setting": self.setting,
        }

    @property
    def display(self) -> str:
        """The figure label: ``PruneX, channel keep 0.5, 4 ranks (emulated 1gbit)``."""
        parts = self.display_parts
        setting = parts.pop("setting")
        return ", ".join(p for p in parts.values() if p) + setting

    @property
    def overlapped_phases(self) -> tuple[str, ...]:
        """Phases that ran during local_compute (DDP's comm hooks); runs recorded before the
        manifest said so: the DDP-based methods' all-reduce."""
        if "overlapped_phases" in self.manifest:
            return tuple(self.manifest["overlapped_phases"])
        ddp_based = self.method.startswith("ddp") or self.method == "powersgd"
        return (phases.ALLREDUCE,) if ddp_based else ()

    @property
    def series(self) -> str:
        """The line a run belongs to in scaling plots: everything but the GPU count."""
        options = json.dumps(self.summary.get("options") or {}, sort_keys=True)
        return f"{self.summary['method']} {options if options != '{}' else ''}".strip() + (
            self.setting
        )

    def table(self, name: str) -> pd.DataFrame | None:
        return self._tables.get(name)

    @cached_property
    def _tables(self) -> dict[str, pd.DataFrame]:
        tables = {}
        for name in ("iterations", "evals", "layers"):
            path = self.folder / f"{name}.parquet"
            if path.exists():
                try:
                    tables[name] = pd.read_parquet(path)
                except Exception as exc:  # pyarrow raises several kinds for a damaged file
                    self.unreadable.append(f"{path}: {type(exc).__name__}: {first_line(exc)}")
        return tables

    @property
    def epochs(self) -> float | None:
        return self.summary.get("epochs")

    @cached_property
    def export(self) -> dict | None:
        """``export.json`` of ``bench export`` (the physically smaller model), if any."""
        path = self.folder / "export.json"
        if not path.exists():
            return None
        try:
            return json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            self.unreadable.append(f"{path}: {type(exc).__name__}: {first_line(exc)}")
            return None


def load_runs(results_dir: str | Path) -> tuple[list[Run], list[str]]:
    """Finished (status ok) runs anywhere under ``results_dir``, and a line per run skipped."""
    root = Path(results_dir)
    if not root.is_dir():
        raise BenchError(f"{root} is not a directory of run folders")
    runs, skipped = [], []
    for path in sorted(root.rglob(SUMMARY)):
        folder = path.parent
        try:
            summary = RunFolder(folder).summary()
        except (OSError, json.JSONDecodeError) as exc:
            skipped.append(f"{folder}: unreadable summary.json ({exc.__class__.__name__})")
            continue
        if summary.get("status") != "ok":
            skipped.append(f"{folder}: status {summary.get('status')!r}")
            continue
        manifest, unreadable = {}, []
        try:
            manifest = RunFolder(folder).manifest() or {}
        except (OSError, json.JSONDecodeError) as exc:
            unreadable.append(f"{folder / MANIFEST}: {type(exc).__name__}")
        run = Run(folder, summary, manifest, unreadable)
        run.table("iterations")  # read the tables now, so damaged ones are listed up front
        runs.append(run)
    if not runs:
        raise BenchError(f"no finished run folders under {root}")
    return runs, skipped


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:160] if text else ""


def final_density_of(run: Run) -> float:
    """Density of the pruned layers at the end (PruneX); 1.0 for dense methods."""
    frame = run.table("iterations")
    if frame is not None and "density" in frame and frame["density"].notna().any():
        return float(frame["density"].dropna().iloc[-1])
    return 1.0
