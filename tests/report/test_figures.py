"""Figures as a reviewer wants them (issue 44), read from the rendered matplotlib objects, not
pixels: GPUs, not ranks, and what they were; the workload, layout and budget on every figure;
every PruneX label names its keep; markers that share a point drawn apart; no error-bar glyph
for a single run; budgets as words; every bar inside its axis and no empty panel; machine
classes and budgets kept apart, never pooled as repeats."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from matplotlib.container import ErrorbarContainer
from matplotlib.lines import Line2D
from matplotlib.patches import PathPatch, Rectangle

import suite.report.figures as figures
from suite.report.render import render

REPO = Path(__file__).resolve().parents[2]
NIGHTLY = REPO / "tests" / "fixtures" / "references" / "cpu-gloo-amd25-avx512-t1"
#: a simulated scaling sweep that takes seconds (the sim page's first example, smaller)
SWEEP = ["sim", "--method", "prunex,ddp", "--gpus", "8,16,32", "--workload", "cnn-fmnist",
         "--profile", "v100-ib100"]


def rendered(runs: Path, out: Path, monkeypatch) -> tuple[dict, list[str]]:
    """``bench report``'s figures of ``runs`` as matplotlib objects (name -> figure), and
    the lines it printed."""
    drawn = {}
    save = figures.save

    def keep(fig, folder, name):
        drawn[name] = fig
        return save(fig, folder, name)

    monkeypatch.setattr(figures, "save", keep)
    lines: list[str] = []
    render(runs, out, echo=lines.append)
    return drawn, lines


@pytest.fixture(scope="module")
def nightly_and_sweep(tmp_path_factory):
    """The nightly's runs (one machine class, a tenth of an epoch) and a simulated scaling
    sweep (1 epoch) in one results folder."""
    root = tmp_path_factory.mktemp("runs")
    for folder in NIGHTLY.iterdir():
        if folder.is_dir():
            shutil.copytree(folder, root / folder.name)
    proc = subprocess.run([sys.executable, "-m", "suite.cli", *SWEEP, "--results-dir",
                           str(root)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return root


@pytest.fixture
def drawn(nightly_and_sweep, tmp_path, monkeypatch):
    return rendered(nightly_and_sweep, tmp_path / "report", monkeypatch)


def texts(fig) -> list[str]:
    """Every text a figure shows: title, panels' titles and axis labels, ticks, legends."""
    found = [fig._suptitle.get_text() if fig._suptitle else ""]
    for ax in fig.axes:
        found += [ax.get_title(), ax.get_xlabel(), ax.get_ylabel()]
        found += [t.get_text() for t in ax.get_xticklabels() + ax.get_yticklabels()]
    for legend in fig.legends:
        found += [t.get_text() for t in legend.get_texts()]
    return [" ".join(t.split()) for t in found if t]


def legend_labels(fig) -> list[str]:
    return [t.get_text() for legend in fig.legends for t in legend.get_texts()]


def test_every_figure_names_gpus_workload_layout_and_budget(drawn):
    figs, lines = drawn
    assert set(figs) >= {"fig09_scaling", "fig12_pareto", "fig06_inter_node_volume",
                         "fig08_phase_breakdown", "fig05_time_to_accuracy"}
    for name, fig in figs.items():
        title = fig._suptitle.get_text().replace("\n", " ")
        assert not any(re.search(r"\branks?\b", t) and "CPU ranks standing in" not in t
                       for t in texts(fig)), (name, texts(fig))
        assert "cnn-fmnist" in title, (name, title)
        assert re.search(r"GPUs as \d+ nodes x \d+|\d+ GPUs per node|GPUs: in each", title)
        assert re.search(r"\b[\d.]+ epochs?\b|budget: in each", title), (name, title)
        raw = [t for t in texts(fig) if re.search(r"\b(0(\.\d+)?|1) epochs\b|batch_size", t)]
        assert not raw, (name, raw)  # "1 epochs", "batch_size 32": keys, not words
    scaling = figs["fig09_scaling"]
    assert all(ax.get_xlabel() == "GPUs (log scale)" for ax in scaling.axes)
    title = scaling._suptitle.get_text().replace("\n", " ")
    assert "simulated GPUs (profile v100-ib100)" in title and "1 epoch" in title
    assert "speedup over 8 GPUs" in scaling.axes[0].get_ylabel()


def test_every_prunex_label_names_its_keep_and_budgets_are_words(drawn):
    figs, _ = drawn
    for name, fig in figs.items():
        for label in legend_labels(fig) + [t.get_text() for ax in fig.axes
                                           for t in ax.get_yticklabels()]:
            if label.startswith("PruneX"):
                assert "keep" in label, (name, label)
    volume = figs["fig06_inter_node_volume"]
    # a row per budget: the nightly's tenth of an epoch and the sweep's epoch, each said in
    # words in its row's title; the sweep's labels name their GPUs
    titles = [ax.get_title("left") for ax in volume.axes if ax.get_title("left")]
    assert "0.1 epoch" in titles and any(t.startswith("1 epoch") for t in titles), titles
    labels = [t.get_text() for ax in volume.axes for t in ax.get_yticklabels()]
    assert any(re.search(r", 16 GPUs$", label) for label in labels), labels


def marker_positions(ax) -> list[tuple[str, np.ndarray]]:
    """(label, where it is drawn in display space) of each one-point marker of ``ax``."""
    ax.figure.canvas.draw()
    found = []
    for line in ax.lines:
        x, y = line.get_xdata(), line.get_ydata()
        if len(x) == 1 and line.get_marker() not in (None, "", "None"):
            point = line.get_transform().transform((float(x[0]), float(y[0])))
            found.append((line.get_label(), point))
    return found


def test_markers_that_share_a_point_are_drawn_apart(drawn):
    figs, _ = drawn
    pareto = figs["fig12_pareto"]
    density = pareto.axes[1]  # DDP, its 16-bit hooks, Top-K, PowerSGD: all at density 1.0
    data = {line.get_label(): (line.get_xdata()[0], line.get_ydata()[0])
            for line in density.lines
            if len(line.get_xdata()) == 1 and line.get_label() != "Pareto frontier"}
    # at one density, less than half a point of accuracy apart: one blob unless dodged
    same = [(a, b) for a in data for b in data
            if a < b and data[a][0] == data[b][0] and abs(data[a][1] - data[b][1]) < 0.5]
    assert same, "the nightly has configurations at one point (DDP, bf16 and fp16)"
    where = dict(marker_positions(density))
    for a, b in same:
        assert np.abs(where[a] - where[b]).max() >= 3, (a, b)  # pixels apart at 100 dpi
    scaling = figs["fig09_scaling"]  # every line starts at speedup 1 on the fewest GPUs
    starts = [line.get_transform().transform((line.get_xdata()[0], line.get_ydata()[0]))
              for line in scaling.axes[0].lines if line.get_label() != "ideal"]
    assert len({tuple(np.round(p, 1)) for p in starts}) == len(starts) >= 2


def test_single_runs_have_no_error_bar_glyph(drawn):
    figs, _ = drawn
    pareto = figs["fig12_pareto"]
    assert not [c for ax in pareto.axes for c in ax.containers
                if isinstance(c, ErrorbarContainer)]  # every configuration is one run
    handles = [h for legend in pareto.legends for h in legend.legend_handles]
    assert handles and all(isinstance(h, Line2D) for h in handles)


def test_every_bar_is_inside_its_axis_and_no_panel_is_empty(drawn):
    figs, _ = drawn
    for name, fig in figs.items():
        for ax in fig.axes:
            if not ax.get_visible():
                continue
            assert figures.draws_data(ax), (name, ax.get_title())
            low, high = sorted(ax.get_xlim())
            for bar in (p for p in ax.patches if isinstance(p, Rectangle)):
                if bar.get_width() <= 0:
                    continue
                assert low - 1e-12 <= bar.get_x() and bar.get_x() + bar.get_width() <= high * (
                    1 + 1e-9), (name, bar.get_x(), bar.get_width(), (low, high))


def test_a_report_over_two_machine_classes_keeps_them_apart(tmp_path, monkeypatch):
    """The nightly of two classes, one seed each: never repeats of one configuration. The
    second class is the same runs as if timed under AVX2 kernels (the committed classes were
    recorded at different versions, so their configurations differ)."""
    runs = tmp_path / "runs"
    for capability in ("AVX512", "AVX2"):
        for folder in NIGHTLY.iterdir():
            if folder.is_dir():
                copy = runs / f"{capability}-{folder.name}"
                shutil.copytree(folder, copy)
                manifest = json.loads((copy / "manifest.json").read_text())
                manifest["hardware"]["cpu_capability"] = capability
                (copy / "manifest.json").write_text(json.dumps(manifest))
    figs, lines = rendered(runs, tmp_path / "report", monkeypatch)
    named = [line for line in lines if "machine classes" in line]
    assert named == ["runs of 2 machine classes (cpu-gloo-amd25-avx2-t1, "
                     "cpu-gloo-amd25-avx512-t1), kept apart in every table and figure"]
    summary = pd.read_csv(tmp_path / "report" / "summary.csv")
    assert len(summary) == 22 and (summary.repeats == 1).all()
    assert summary.groupby("method").machine_class.nunique().eq(2).all()
    assert (summary.seeds.astype(str) == "0").all()
    assert "runs of 2 machine classes" in (tmp_path / "report" / "report.md").read_text()
    pareto = figs["fig12_pareto"]  # a row of panels per class, one legend for both
    titles = {ax.get_title("left") for ax in pareto.axes} - {""}
    assert titles == {"cpu-gloo-amd25-avx2-t1", "cpu-gloo-amd25-avx512-t1"}  # the suptitle
    assert "cnn-fmnist" in pareto._suptitle.get_text()  # says what both rows share
    assert len(legend_labels(pareto)) == 12  # 11 methods and the frontier
    phases = figs["fig08_phase_breakdown"]  # a row per class, its bars named within it
    rows = {ax.get_title(): [t.get_text() for t in ax.get_yticklabels()] for ax in phases.axes
            if ax.get_yticklabels()}
    assert set(rows) == {"cpu-gloo-amd25-avx2-t1", "cpu-gloo-amd25-avx512-t1"}
    assert all(len(bars) == 11 for bars in rows.values())


def test_repeats_of_one_seed_on_two_classes_are_not_pooled(tmp_path):
    """Runs of seed 0 on several classes (old committed references) were reported as
    `repeats 3, seeds 0,0,0` with a 20-point interval."""
    out = tmp_path / "report"
    render(REPO / "tests" / "fixtures" / "references", out, echo=lambda line: None)
    summary = pd.read_csv(out / "summary.csv")
    prunex = summary[summary.method == "prunex"]
    assert len(prunex) == 2 and (prunex.repeats == 1).all()
    assert prunex.final_acc_ci95.isna().all()
    assert sorted(prunex.machine_class) == ["cpu-gloo", "cpu-gloo-amd25-avx512-t1"]
    assert json.loads(json.dumps(list(prunex.seeds.astype(str)))) == ["0", "0"]


def test_the_summary_shows_each_methods_exchange_schedule(nightly_and_sweep, tmp_path):
    out = tmp_path / "report"
    render(nightly_and_sweep, out, echo=lambda line: None)
    summary = pd.read_csv(out / "summary.csv", dtype={"exchange_steps": str})
    sims = summary[summary.setting == "sim v100-ib100"].set_index(["method", "gpus"])
    assert sims.loc[("ddp", 8), "exchange_steps"] == "1 / 1"
    assert sims.loc[("prunex", 8), "exchange_steps"] == "4 / 32"
    nightly = summary[summary.setting == "real"]
    assert (nightly.exchange_steps == "-").all()  # recorded before the key existed
    assert "exchange_steps" in (out / "report.md").read_text()
    assert "Exchange (steps)" in (out / "table.md").read_text()


def test_the_compared_methods_colours_stay_apart_in_print_and_for_colour_blind_readers():
    """PruneX, GMP, Top-K and DDP (the methods a Pareto figure sets side by side): their
    colours at least 15 apart (CAM02-UCS) as seen with each full colour-vision deficiency,
    and 10 apart in lightness alone (a greyscale print); their markers all differ."""
    import itertools

    from colorspacious import cspace_convert, deltaE

    from suite.report.style import method_style

    looks = {m: method_style(m) for m in ("prunex", "gmp-hier", "topk", "ddp")}
    assert len({look.marker for look in looks.values()}) == len(looks)

    def seen(look, deficiency):
        rgb = [int(look.color[i:i + 2], 16) / 255 for i in (1, 3, 5)]
        if deficiency:
            rgb = cspace_convert(rgb, {"name": "sRGB1+CVD", "cvd_type": deficiency,
                                       "severity": 100}, "sRGB1")
        return [min(1.0, max(0.0, c)) for c in rgb]

    for a, b in itertools.combinations(looks, 2):
        for deficiency in (None, "deuteranomaly", "protanomaly", "tritanomaly"):
            distance = deltaE(seen(looks[a], deficiency), seen(looks[b], deficiency),
                              input_space="sRGB1", uniform_space="CAM02-UCS")
            assert distance >= 15, (a, b, deficiency, distance)
        lightness = [cspace_convert(seen(looks[m], None), "sRGB1", "CAM02-UCS")[0]
                     for m in (a, b)]
        assert abs(lightness[0] - lightness[1]) >= 10, (a, b, lightness)


def test_a_keep_has_one_fill_across_methods_and_the_legend_reads_in_keep_order():
    """Runs that come in any order: the same keep gets the same fill and line style in
    every method, the smallest keep full, and the rows sort by method then keep."""
    import pandas as pd

    from suite.report.figures import sorted_by_method_and_keep
    from suite.report.style import keep_of, series_styles

    runs = [("gmp 0.5", "gmp-hier", 0.5), ("prunex 0.7", "prunex", 0.7),
            ("gmp 0.3", "gmp-hier", 0.3), ("prunex 0.5", "prunex", 0.5),
            ("gmp 0.7", "gmp-hier", 0.7), ("prunex 0.3", "prunex", 0.3), ("ddp", "ddp", None)]
    keeps = {label: keep_of({"channel_keep": keep} if keep else {}) for label, _, keep in runs}
    styles = series_styles([(label, method) for label, method, _ in runs], keeps)
    for keep in (0.3, 0.5, 0.7):
        looks = {(styles[f"{m} {keep}"]["fillstyle"], styles[f"{m} {keep}"]["ls"])
                 for m in ("gmp", "prunex")}
        assert len(looks) == 1, keep
    assert styles["prunex 0.3"]["fillstyle"] == "full"
    assert styles["prunex 0.5"]["fillstyle"] != styles["prunex 0.7"]["fillstyle"]
    frame = pd.DataFrame({"label": [r[0] for r in runs], "method": [r[1] for r in runs]})
    ordered = sorted_by_method_and_keep(frame, keeps).label.tolist()
    assert ordered == ["ddp", "gmp 0.3", "gmp 0.5", "gmp 0.7", "prunex 0.3", "prunex 0.5",
                       "prunex 0.7"]


def test_dodged_markers_keep_their_left_right_order_and_only_overlapping_ones_move():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from suite.report.style import dodge

    fig, ax = plt.subplots(figsize=(3, 2))
    ax.set_xlim(0, 100)
    ax.set_ylim(0, 100)
    # drawn right one first (the order of runs in a folder): 50.4 then 50.0, one point apart
    points = [(ax.plot([x], [y], "o", ms=4), x, y) for x, y in ((50.4, 50), (50.0, 50),
                                                                   (90, 10))]
    offsets = dodge(ax, points)
    assert offsets[1] < 0 < offsets[0]  # the left one stays left
    assert offsets[2] == 0  # far from the others: not moved
    lines = [child for child in ax.get_children()
             if isinstance(child, matplotlib.text.Annotation)]
    assert len(lines) == 2  # a thin line from each moved marker to its true point
    plt.close(fig)


def test_the_overlap_check_finds_texts_that_overlap():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from suite.report.style import overlapping_texts

    fig, ax = plt.subplots(figsize=(3, 2))
    ax.set_xlim(0, 10)
    ax.text(5, 5, "one label")
    assert overlapping_texts(fig) == []
    ax.text(5.05, 5.05, "another label")  # on the first
    assert ("one label", "another label") in overlapping_texts(fig)
    plt.close(fig)


@pytest.mark.integration  # a real run of a minute: nox -s integration
def test_no_text_overlaps_another_in_any_figure_of_the_references_and_a_simulation(tmp_path):
    """Every figure of a report of the committed references, and of a simulated sweep
    (scaling, volume), drawn with no text box on another: titles, axis and tick labels,
    legends, keys, annotations."""
    from suite.report import style

    sims = tmp_path / "sims"
    proc = subprocess.run([sys.executable, "-m", "suite.cli", "sim", "--method", "prunex,ddp",
                           "--gpus", "8,16", "--workload", "cnn-fmnist", "--results-dir",
                           str(sims)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    checked = {}
    for source in (REPO / "reference" / "cpu-gloo-amd25-avx512-t1", sims):
        style.OVERLAPS.clear()
        render(source, tmp_path / source.name, echo=lambda line: None)
        checked.update({f"{source.name}/{name}": pairs
                        for name, pairs in style.OVERLAPS.items()})
    assert len(checked) >= 10  # the references' figures and the simulation's
    assert {name: pairs for name, pairs in checked.items() if pairs} == {}


@pytest.mark.integration  # a real run of a minute: nox -s integration
def test_a_default_keep_is_that_keep_in_every_figure_with_keeps(tmp_path, monkeypatch):
    """PruneX left at its default keep (0.5) is keep 0.5, not "no keep": fig. 12's rows and
    fig. 8's bars read PruneX 0.25 before 0.5, and fig. 7's boxes of one keep look alike
    across methods (GMP and PruneX at 0.5)."""
    from tests.report.varied_runs import varied_runs

    figs, _ = rendered(varied_runs(tmp_path / "runs"), tmp_path / "report", monkeypatch)
    pareto = pd.read_csv(tmp_path / "report" / "fig12_pareto.csv")
    prunex = pareto[pareto.method == "prunex"].label.tolist()
    assert [("0.25" in label, "0.5" in label) for label in prunex] == [(True, False),
                                                                      (False, True)]
    bars = [t.get_text() for ax in figs["fig08_phase_breakdown"].axes
            for t in ax.get_yticklabels()]
    bars = [label for label in bars if label.startswith("PruneX, channel keep")]
    assert len(bars) == 2
    assert bars == sorted(bars, key=lambda label: "0.25" not in label, reverse=True)  # top down
    boxes = next(ax for ax in figs["fig07_comm_latency"].axes
                 if any(t.get_text().startswith("GMP") for t in ax.get_yticklabels()))
    labels = [t.get_text() for t in boxes.get_yticklabels()]
    look = {label: (patch.get_hatch(), patch.get_facecolor()[:3] == (1.0, 1.0, 1.0))
            for label, patch in zip(labels, [p for p in boxes.patches
                                             if isinstance(p, PathPatch)])}
    gmp = next(label for label in labels if label.startswith("GMP"))
    prunex_half = next(label for label in labels if label.startswith("PruneX, channel keep 0.5"))
    prunex_quarter = next(label for label in labels if "keep 0.25" in label)
    assert look[gmp] == look[prunex_half] != look[prunex_quarter]


def test_a_reader_sees_accuracy_in_percent_and_the_files_keep_the_fraction():
    from suite.report.tables import in_percent

    table = pd.DataFrame({"final_acc": [0.6753], "final_acc_ci95": [0.01],
                          "accuracy": [0.5], "accuracy_pct": [50.0], "accuracy_pct_ci95": [1.0]})
    shown = in_percent(table)
    assert list(shown.columns) == ["final_acc (%)", "final_acc_ci95 (%)", "accuracy (%)",
                                   "accuracy_ci95 (%)"]
    assert shown.iloc[0].tolist() == pytest.approx([67.53, 1.0, 50.0, 1.0])
    assert table.final_acc.iat[0] == 0.6753  # the table itself is left as it was
