"""`bench report` linear in the runs (issue 46): the labels are computed once per configuration
(counted calls, not seconds, over 200 copies of the reference runs), and the figures' tables,
the summary tables and the labels of a varied small set are the bytes recorded in
tests/report/data/report_before (by the code before the result set was read once, and again
for issue 44's intended changes: its README lists them)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

import suite.report.labels as labels
from suite.report.labels import LABEL
from suite.report.load import load_runs
from suite.report.render import render
from suite.results.view import RunView
from tests.report.varied_runs import varied_runs

#: minutes of real runs and reports: nox -s integration
pytestmark = pytest.mark.integration

HERE = Path(__file__).resolve().parent
BEFORE = HERE / "data" / "report_before"
REPO = HERE.parents[1]
#: what the report writes from the tables (figures' own files are drawn from these)
TABLES = sorted(p.name for p in BEFORE.iterdir() if p.suffix in (".csv", ".tex")
                or p.name in ("table.md", "report.md"))


@pytest.fixture(scope="module")
def varied(tmp_path_factory):
    root = tmp_path_factory.mktemp("varied")
    runs = varied_runs(root / "runs")
    lines: list[str] = []
    render(runs, root / "report", echo=lines.append)
    return runs, root / "report", lines


@pytest.mark.parametrize("name", TABLES)
def test_the_tables_of_a_varied_set_are_the_bytes_written_before(varied, name):
    runs, report, _ = varied
    written = (report / name).read_text()
    if name == "report.md":  # it names the folder it read
        written = written.replace(str(runs), "RUNS")
    assert written == (BEFORE / name).read_text()


def test_the_labels_and_skipped_runs_of_a_varied_set_are_those_of_before(varied):
    runs, _, lines = varied
    loaded, _ = load_runs(runs)
    now = dict(zip(loaded.runs["run_id"], loaded.runs[LABEL]))
    assert now == json.loads((BEFORE / "labels.json").read_text())
    assert "\n".join(lines).replace(str(runs), "RUNS") == (BEFORE / "echo.txt").read_text()
    assert len(set(now.values())) == 18  # 21 runs: three seeds of PruneX, two of DDP


def copies(root: Path, runs: int) -> Path:
    """``runs`` copies of the committed reference runs, as benchmarks/report_scale.py makes
    them (distinct run ids and seeds)."""
    spec = importlib.util.spec_from_file_location(
        "report_scale", REPO / "benchmarks" / "report_scale.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("report_scale", module)  # its dataclasses look themselves up
    spec.loader.exec_module(module)
    module.grow(root, module.reference_runs(REPO / "reference"), 0, runs)
    return root


def test_a_report_of_200_runs_labels_each_configuration_once(tmp_path, monkeypatch):
    """The labels were quadratic in the runs (each run's label looked at every run's display
    parts: ~240,000 calls at 200 runs); now the display parts are made once per
    configuration and each run's configuration is resolved once."""
    calls = {"display_parts": 0, "configuration": 0}

    def counted(name, function):
        def wrapper(*args, **kwargs):
            calls[name] += 1
            return function(*args, **kwargs)
        return wrapper

    monkeypatch.setattr(labels, "display_parts", counted("display_parts", labels.display_parts))
    monkeypatch.setattr(RunView, "configuration",
                        counted("configuration", RunView.configuration))
    runs = 200
    render(copies(tmp_path / "runs", runs), tmp_path / "report", echo=lambda line: None)
    counted_calls = dict(calls)
    loaded, _ = load_runs(tmp_path / "runs")
    configurations = loaded.runs[LABEL].nunique()
    assert len(loaded) == runs and configurations == 22  # 11 methods on 2 classes, apart
    # each run's configuration: once for its key, once for the options it shows
    assert 0 < counted_calls["configuration"] <= 2 * runs
    # the display parts: once per configuration for the report's labels, and once per
    # configuration of the subset of PruneX runs (fig. 11 labels those among themselves)
    assert 0 < counted_calls["display_parts"] <= 2 * configurations
