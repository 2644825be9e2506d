"""A tiny sweep (3 methods x 2 rank counts, and a second seed at 2 ranks) resumes, and
`bench report` draws every figure its data allows as PDF, SVG and PNG, in each method's fixed
colour, with repeats reduced to mean and interval, a LaTeX table, the run ids named, and says
why it skips the others."""

import json
import os
import shutil
import subprocess
import sys

import pandas as pd
import pytest

from suite.report.style import method_style

#: minutes of real runs and reports: nox -s integration
pytestmark = pytest.mark.integration

BENCH = [sys.executable, "-m", "suite.cli"]
SWEEP = ["sweep", "--method", "prunex,ddp,localsgd-hier", "--gpus", "1,2", "--dataset",
         "synthetic", "--iterations", "3", "--batch-size", "8", "--local-steps", "2"]
SECOND_SEED = [*SWEEP[:4], "2", *SWEEP[5:], "--seed", "1"]
DRAWN = ["fig09_scaling", "fig12_pareto", "fig05_time_to_accuracy", "fig07_comm_latency",
         "fig08_phase_breakdown", "fig06_inter_node_volume", "fig10_residuals", "fig11_rho",
         "fig13_masks"]


def bench(*args, **kwargs):
    env = {**os.environ, "PRUNEX_PROGRESS": "0"}
    return subprocess.run([*BENCH, *args], capture_output=True, text=True, env=env,
                          timeout=600, **kwargs)


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    results = tmp_path_factory.mktemp("sweep")
    for grid in (SWEEP, SECOND_SEED):
        proc = bench(*grid, "--results-dir", str(results))
        assert proc.returncode == 0, proc.stderr[-3000:]
    return results


def run_ids(results):
    return sorted(json.loads(p.read_text())["run_id"] for p in results.glob("*/summary.json"))


@pytest.mark.slow
def test_sweep_runs_cells_once_and_resumes(swept):
    ids = run_ids(swept)
    assert len(ids) == 9 and {i.split("-cnn")[0] for i in ids} == {"prunex", "ddp", "localsgd-hier"}
    again = bench(*SWEEP, "--results-dir", str(swept))
    assert again.returncode == 0 and "0 done, 6 skipped, 0 failed" in again.stdout
    # a broken cell is moved aside (its rows kept) and run again; the rest are skipped
    broken = swept / ids[0]
    summary = json.loads((broken / "summary.json").read_text())
    (broken / "summary.json").write_text(json.dumps({**summary, "status": "failed"}))
    rerun = bench(*SWEEP, "--results-dir", str(swept))
    assert "1 done, 5 skipped, 0 failed" in rerun.stdout, rerun.stdout
    assert (swept / f"{ids[0]}.failed-1" / "iterations.parquet").exists()
    shutil.rmtree(swept / f"{ids[0]}.failed-1")


def test_option_lists_fan_out_only_the_methods_that_read_them(tmp_path):
    grid = ["--method", "prunex,ddp", "--channel-keep", "0.3,0.5", "--gpus", "4,8"]
    proc = bench(
        "sweep", "--dry-run", *grid, "--dataset", "synthetic", "--results-dir", str(tmp_path)
    )
    cells = proc.stdout.strip().splitlines()
    assert proc.returncode == 0 and len(cells) == 6, proc.stdout
    assert sum(c.startswith("prunex") for c in cells) == 4
    assert sum("channel_keep" in c for c in cells) == 4


@pytest.mark.slow
def test_report_draws_every_figure_and_names_runs(swept, tmp_path):
    out = tmp_path / "report"
    proc = bench("report", str(swept), "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    for name in DRAWN:
        assert (out / f"{name}.png").stat().st_size > 5000, name
        assert (out / f"{name}.pdf").read_bytes().startswith(b"%PDF"), name
        assert (out / f"{name}.svg").exists() and (out / f"{name}.csv").exists()
    md = (out / "report.md").read_text()
    for run_id in run_ids(swept):
        assert run_id in md
    assert md.count("Runs: ") == len(DRAWN)
    assert "data:image/png;base64," in (out / "report.html").read_text()
    # repeats: the two seeds at 2 ranks are one configuration with an interval
    summary = pd.read_csv(out / "summary.csv")
    two = summary[summary.gpus == 2]
    assert len(summary) == 6 and two.repeats.tolist() == [2, 2, 2]
    assert two.final_acc_ci95.notna().all()
    assert summary[summary.gpus == 1].final_acc_ci95.isna().all()
    pareto = pd.read_csv(out / "fig12_pareto.csv")
    assert len(pareto) == 6 and sorted(pareto.repeats) == [1, 1, 1, 2, 2, 2]
    # the LaTeX table: booktabs, balanced, one row per configuration with mean +- interval
    tex = (out / "table.tex").read_text()
    assert tex.count(r"\begin{tabular}") == tex.count(r"\end{tabular}") == 1
    assert all(rule in tex for rule in (r"\toprule", r"\midrule", r"\bottomrule"))
    body = tex.split(r"\midrule")[1].split(r"\bottomrule")[0].strip().splitlines()
    columns = tex.split(r"\begin{tabular}{")[1].split("}")[0]
    assert len(body) == 6 and all(line.count("&") == len(columns) - 1 for line in body)
    assert sum(r"$\pm$" in line for line in body) == 3  # the 2-rank rows have two seeds
    # one colour per method in every figure, whatever the set of runs
    for name in ("fig05_time_to_accuracy", "fig06_inter_node_volume", "fig12_pareto"):
        svg = (out / f"{name}.svg").read_text().lower()
        for method in ("prunex", "localsgd-hier"):  # (DDP's black is in every figure's text)
            assert method_style(method).color.lower() in svg, (name, method)
        assert 'id="legend_1"' in svg, f"{name} has no legend"


@pytest.mark.slow
def test_report_shows_exported_size_next_to_accuracy(swept, tmp_path):
    results = tmp_path / "results"
    shutil.copytree(swept, results)
    prunex = next(p.parent for p in results.glob("prunex-*/masks.pt"))
    proc = bench("export", str(prunex), "--repeats", "3")
    assert proc.returncode == 0, proc.stderr
    record = json.loads((prunex / "export.json").read_text())
    out = tmp_path / "report"
    assert bench("report", str(results), "-o", str(out)).returncode == 0
    pareto = pd.read_csv(out / "fig12_pareto.csv")
    gflops = dict(zip(pareto.method, pareto.gflops))  # dense methods: the dense model's
    assert gflops["ddp"] == pytest.approx(record["dense"]["flops"] / 1e9)
    assert pareto.gflops.min() == pytest.approx(record["exported"]["flops"] / 1e9)
    runs = pd.read_csv(out / "runs.csv").set_index("run_id")
    assert runs.loc[record["run_id"], "exported_params_M"] == pytest.approx(
        record["exported"]["parameters"] / 1e6
    )
    assert runs.exported_params_M.notna().sum() == 1
    assert "Exported params (M)" in (out / "table.md").read_text()


@pytest.mark.slow
def test_a_method_keeps_its_colour_in_any_subset_of_runs(swept, tmp_path):
    subset = tmp_path / "subset"
    subset.mkdir()
    for folder in swept.iterdir():
        if folder.name.startswith("prunex"):
            shutil.copytree(folder, subset / folder.name)
    proc = bench("report", str(subset), "-o", str(tmp_path / "r"))
    assert proc.returncode == 0, proc.stderr
    svg = (tmp_path / "r" / "fig12_pareto.svg").read_text().lower()
    assert method_style("prunex").color.lower() in svg
    assert method_style("localsgd-hier").color.lower() not in svg  # only prunex runs here


@pytest.mark.slow
def test_report_skips_missing_data_and_bad_runs_with_a_reason(swept, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(swept, copy)
    for folder in (p for p in copy.iterdir() if p.is_dir()):
        for name in ("layers.parquet", "masks.pt"):
            (folder / name).unlink(missing_ok=True)
    broken = sorted(p for p in copy.iterdir() if p.is_dir())[0]
    (broken / "summary.json").write_text("{not json")
    proc = bench("report", str(copy), "-o", str(tmp_path / "r"))
    assert proc.returncode == 0, proc.stderr
    assert "Skipped: Primal residuals per layer (fig10_residuals): no PruneX run" in proc.stdout
    assert "Skipped: Learned structured masks" in proc.stdout
    assert f"skipped run {broken}: unreadable summary.json" in proc.stdout
    assert (tmp_path / "r" / "fig09_scaling.png").exists()


def test_report_of_nothing_is_one_line(tmp_path):
    proc = bench("report", str(tmp_path / "missing"), "-o", str(tmp_path / "r"))
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1
    assert "is not a directory of run folders" in proc.stderr


def test_runs_of_different_settings_are_different_lines(tmp_path):
    """A scaling line never mixes simulated profiles, emulated link rates and plain runs."""
    from suite.report.labels import LABEL, line_table
    from suite.report.load import parts_of, report_runs
    from suite.results.view import RunView

    summary = {"method": "ddp", "workload": "cnn-fmnist", "gpus": 8, "options": {}}

    def run(manifest, simulated=False):
        return RunView(tmp_path, {**summary, "simulated": simulated}, manifest)

    runs = report_runs([
        run({"simulation": {"profile": {"name": "v100-ib100"}}}, simulated=True),
        run({"simulation": {"profile": {"name": "v100-paper-fig7"}}}, simulated=True),
        run({"network": {"mode": "emulated", "inter_bw": "200mbit"}}),
        run({"network": {"mode": "emulated", "inter_bw": "1gbit"}}),
        run({}),
    ]).runs
    lines = line_table(runs, parts_of(runs))
    assert lines.nunique() == runs[LABEL].nunique() == 5
    assert lines[0] == "DDP (sim v100-ib100)" and runs[LABEL][4] == "DDP"


def test_pareto_frontier_keeps_only_undominated_points():
    from suite.report.figures import pareto_front

    gb = pd.Series([1.0, 2.0, 3.0, 0.5, 2.5])
    accuracy = pd.Series([80.0, 85.0, 84.0, 70.0, 90.0])
    assert pareto_front(gb, accuracy) == [3, 0, 1, 4]  # 3.0 GB at 84 % is beaten by 2.5 GB
