"""The finished runs under a results directory, as the report's figures and tables draw them."""

from __future__ import annotations

import json
from functools import cached_property
from pathlib import Path

from suite.cluster import phases
from suite.errors import BenchError
from suite.plugins.registry import METHODS
from suite.results import schema
from suite.results.schema import Status
from suite.results.view import RunView, run_folders


class Run(RunView):
    """A finished run as a figure draws it: a :class:`RunView` with its labels."""

    @property
    def setting_suffix(self) -> str:
        """Where the run's times come from, unless a plain run: `` (sim PROFILE)`` or
        `` (emulated RATE)``. Runs of different settings never share a line or a label."""
        return "" if self.setting == "real" else f" ({self.setting})"

    @cached_property
    def declared(self) -> dict | None:
        """The method's option defaults as installed here (None: not installed)."""

        return METHODS.defaults(self.method)

    @property
    def options(self) -> dict:
        """The options that set this run apart, as labels show them: its configuration less
        defaults and what the method derived (a default spelled out is no difference)."""
        return self.shown_options(self.declared)

    @property
    def label(self) -> str:
        """method, GPUs, the options that were set, and the setting."""
        s = self.summary
        options = ",".join(f"{k.replace('_', '-')}={v}" for k, v in self.options.items())
        text = f"{s[schema.METHOD]} {s[schema.GPUS]}g" + (f" [{options}]" if options else "")
        return text + self.setting_suffix

    @property
    def ranks_word(self) -> str:
        """ "GPUs" when the ranks ran on CUDA devices, else "ranks"."""
        return "GPUs" if str(self.manifest.get("device", "")).startswith("cuda") else "ranks"

    @property
    def display_parts(self) -> dict[str, str]:
        """The pieces of a figure label: method, options, ranks, setting."""
        # lazy: suite.report.style costs ~0.4 s to import; only this path needs it
        from suite.report.style import method_style, options_text

        return {
            "method": method_style(self.method).name,
            "options": options_text(self.options),
            "ranks": f"{self.summary[schema.GPUS]} {self.ranks_word}",
            "setting": self.setting_suffix,
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
        options = json.dumps(self.configuration(self.declared), sort_keys=True)
        return f"{self.method} {options if options != '{}' else ''}".strip() + (
            self.setting_suffix
        )


def load_runs(results_dir: str | Path) -> tuple[list[Run], list[str]]:
    """Finished (status ok) runs anywhere under ``results_dir``, and a line per run skipped."""
    root = Path(results_dir)
    if not root.is_dir():
        raise BenchError(f"{root} is not a directory of run folders")
    runs, skipped = [], []
    for folder in run_folders(root):
        try:
            run = Run.read(folder)
        except BenchError as exc:
            skipped.append(str(exc))
            continue
        if run.status != Status.OK:
            skipped.append(f"{folder}: status {run.status!r}")
            continue
        run.table("iterations")  # read the tables now, so damaged ones are listed up front
        runs.append(run)
    if not runs:
        raise BenchError(f"no finished run folders under {root}")
    return runs, skipped


def final_density_of(run: Run) -> float:
    """Density of the pruned layers at the end (PruneX); 1.0 for dense methods."""
    frame = run.table("iterations")
    if frame is not None and schema.DENSITY in frame and frame[schema.DENSITY].notna().any():
        return float(frame[schema.DENSITY].dropna().iloc[-1])
    return 1.0
