"""A run folder as every reader sees it: ``bench report``, ``bench compare`` and the activity
checks read a run through ``RunView`` (its summary and manifest read once, its tables on
demand, damaged files listed instead of raised), so they agree on what a run is."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq

from suite.errors import BenchError
from suite.results import schema
from suite.results.folder import SUMMARY, RunFolder, setting_of
from suite.results.machine import machine_class
from suite.results.records import (
    SUMMARY_REQUIRED,
    DamagedFile,
    Export,
    check_required,
    read_record,
)
from suite.results.summary import final_train_loss
from suite.results.upgrade import upgrade, upgrade_table


@dataclass
class RunView:
    """One run folder, read: what an activity check is given (``fn(run: RunView)``).

    Attributes:
        folder: the run folder.
        summary: its ``summary.json``.
        manifest: its ``manifest.json`` ({} when unreadable).
        dense_bytes: set by ``bench compare`` for the activity checks: DDP's inter-node bytes
            per iteration in the same result set (same workload, ranks and machine class),
            the dense exchange a method is measured against (None when the set has none).
        unreadable: files that could not be read, with the reason.

    Examples:
        ```python
        def sends_little(run: RunView) -> list[str]:
            if run.dense_bytes and run.bytes_per_iteration > 0.1 * run.dense_bytes:
                return ["sent more than a tenth of DDP's bytes"]
            return []
        ```
    """

    folder: Path
    summary: dict
    manifest: dict = field(default_factory=dict)
    dense_bytes: float | None = None
    #: the format the folder was written in (suite.results.upgrade; read in the current one)
    format_version: int = schema.FORMAT_VERSION
    #: files that could not be read, with the reason (a report lists them and goes on)
    unreadable: list[str] = field(default_factory=list)
    #: the tables read so far (name -> frame, None: absent or unreadable)
    _tables: dict[str, pd.DataFrame | None] = field(default_factory=dict, repr=False,
                                                    compare=False)

    @classmethod
    def read(cls, folder: str | Path) -> RunView:
        """The run in ``folder``, in the current format whatever format wrote it
        (suite.results.upgrade); raises BenchError when its summary cannot be read."""
        run = RunFolder(folder)
        try:
            summary = run.summary()
        except DamagedFile as exc:
            raise BenchError(f"{run.path}: unreadable {SUMMARY}: {exc.problem}") from None
        if summary is None:
            raise BenchError(f"{run.path}: no {SUMMARY}")
        view = cls(run.path, summary)
        try:
            view.manifest = run.manifest() or {}
        except DamagedFile as exc:
            view.unreadable.append(str(exc))
        view.format_version = upgrade(summary, view.manifest)
        try:  # a version-1 summary takes its identity from its manifest in the upgrade
            check_required(summary, SUMMARY_REQUIRED, where=run.path / SUMMARY)
        except DamagedFile as exc:
            raise BenchError(f"{run.path}: unreadable {SUMMARY}: {exc.problem}") from None
        return view

    # -- identity ---------------------------------------------------------------------------
    @property
    def run_id(self) -> str:
        """The run's id, as reports and ``bench compare`` name it: the summary's, else the
        folder's name."""
        return self.summary.get(schema.RUN_ID) or self.folder.name

    @property
    def method(self) -> str:
        """The name the method is registered under (``METHODS``): what picks its activity
        check and its declared defaults. Raises KeyError for a summary without one."""
        return self.summary[schema.METHOD]

    @property
    def status(self) -> str | None:
        """How the run ended (``suite.results.schema.Status``: ``ok``, ``failed``,
        ``interrupted``; ``running`` from before its ranks start until it ends), None when the
        summary has none. A result set of finished runs keeps only ``ok``."""
        return self.summary.get(schema.STATUS)

    @property
    def simulated(self) -> bool:
        """Whether ``bench sim`` wrote the run (its times priced, not measured): its
        ``setting`` differs from a measured run's, so the two are never compared."""
        return bool(self.summary.get(schema.SIMULATED))

    @property
    def settings(self) -> dict:
        """The method's resolved settings (the manifest's ``method_settings``: every option
        with its default filled in, and what the method derived)."""
        return self.manifest.get(schema.METHOD_SETTINGS) or {}

    @property
    def given_options(self) -> dict:
        """The method options the run was given (flags, experiment file)."""
        return self.summary.get(schema.OPTIONS) or {}

    def configuration(self, declared: dict | None) -> dict:
        """The options that make the run's configuration, for matching runs: its resolved
        settings (every option with its default filled in, and what the method derived from
        them, as the manifest records them) less those at the default ``declared`` by the
        method now (option -> default). So a default spelled out and one left out are the
        same configuration, and an option added later at its default changes no run's
        identity. Without declarations (the method is not installed here) or resolved
        settings (a run recorded before manifests held them): the options it was given."""
        resolved = self.settings
        if declared is None or not resolved:
            return dict(sorted(self.given_options.items()))
        return {k: v for k, v in sorted(resolved.items()) if k not in declared or v != declared[k]}

    def shown_options(self, declared: dict | None) -> dict:
        """``configuration`` as a label shows it: without what the method derived on its
        own (an option declared without a default that the run was not given, e.g. PruneX's
        rho1 from its round pull), except the structured keeps, which a label always names
        (``schema.ALWAYS_SHOWN_OPTIONS``: PruneX's default is channel keep 0.5)."""
        given = self.given_options
        return {k: v for k, v in self.configuration(declared).items()
                if k in given or declared is None or declared.get(k, 0) is not None
                or (k in schema.ALWAYS_SHOWN_OPTIONS and v is not None)}

    @property
    def machine_class(self) -> str:
        """The kind of machine the numbers come from (``-`` without a manifest)."""
        return machine_class(self.manifest) if self.manifest else "-"

    @property
    def setting(self) -> str:
        """``real``, ``emulated RATE`` or ``sim PROFILE``: where the run's times come from."""
        return setting_of(self.summary, self.manifest)

    @property
    def recipe(self) -> dict:
        """The workload recipe the run trained with (the manifest's: batch size, lr, its
        schedule, ...; {} without one): what runs are matched and labelled by beside the
        method's options."""
        return self.manifest.get(schema.RECIPE) or {}

    @property
    def epochs(self) -> float | None:
        """Epochs each rank trained (its local steps over the steps per epoch; None when the
        summary has none): the budget reports show and ``bench compare`` matches runs on."""
        return self.summary.get(schema.EPOCHS)

    # -- numbers ----------------------------------------------------------------------------
    @property
    def final_train_loss(self) -> float | None:
        """The summary's, or for a run summarized before it existed, from its rows."""
        if schema.FINAL_TRAIN_LOSS in self.summary:
            return self.summary[schema.FINAL_TRAIN_LOSS]

        frame = self.table("iterations")
        return None if frame is None else final_train_loss(frame)

    @property
    def bytes_per_iteration(self) -> float:
        """Inter-node bytes per iteration, summed over ranks (0.0 when the summary has
        none): what an activity check weighs against ``dense_bytes``."""
        return float(self.summary.get(schema.INTER_NODE_BYTES_PER_ITERATION) or 0.0)

    def table(self, name: str) -> pd.DataFrame | None:
        """``iterations``, ``evals`` or ``layers`` as written (None: absent or unreadable),
        read on first use (a damaged file is listed in ``unreadable`` once)."""
        if name not in self._tables:
            self._tables[name] = self._read_table(name)
        return self._tables[name]

    def _read_table(self, name: str) -> pd.DataFrame | None:
        path = self.folder / f"{name}.parquet"
        if not path.exists():
            return None
        try:
            # what pd.read_parquet returns, at a fifth of its cost for a small file
            frame = pq.ParquetFile(path, memory_map=True).read(use_threads=False).to_pandas()
        except Exception as exc:  # pyarrow raises several kinds for a damaged file
            self.unreadable.append(f"{path}: {type(exc).__name__}: {first_line(exc)}")
            return None
        return upgrade_table(name, frame, self.format_version)

    @cached_property
    def iterations(self) -> pd.DataFrame:
        """Per iteration, the mean over ranks of every numeric column (raises when the run
        has no readable iterations table: an activity check reports that as a finding)."""
        frame = self.table("iterations")
        if frame is None:
            raise FileNotFoundError(f"{self.folder / 'iterations.parquet'} is missing or damaged")
        return frame.groupby(schema.ITERATION).mean(numeric_only=True).reset_index()

    @cached_property
    def export(self) -> dict | None:
        """``export.json`` of ``bench export`` (the physically smaller model), if any."""
        try:
            return read_record(self.folder / "export.json", Export, what="export record")
        except FileNotFoundError:
            return None
        except DamagedFile as exc:
            self.unreadable.append(str(exc))
            return None


def run_folders(root: str | Path) -> list[Path]:
    """``root`` if it is a run folder, else every run folder under it, sorted."""
    root = Path(root)
    if (root / SUMMARY).exists():
        return [root]
    return [path.parent for path in sorted(root.rglob(SUMMARY))]


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:160] if text else ""
