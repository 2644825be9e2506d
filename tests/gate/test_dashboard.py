"""`bench dashboard` opened in a real browser (headless Chromium, Debian's, driven by
Playwright): the index links every class, a class page draws one series per method and gate
metric with a point per nightly, the last night's failures first, a planted change point
marked; no console error, and no request leaves the machine (the site works offline)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from suite.gate.dashboard import PANELS, page_name
from suite.gate.judge import judge_sets
from suite.gate.trend import history_rows
from suite.plugins.registry import METHODS

REPO = Path(__file__).resolve().parents[2]
REFERENCE = REPO / "reference"
PORTABLE = REFERENCE / "cpu-gloo-portable-t1"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
NIGHTS, STEP = 8, 5  # PruneX sends 30 % more from night 6 on
OTHER = "cpu-gloo-amd25-avx512-t1"


def chromium():
    """Playwright's sync API and Debian's chromium; CI (.ci/run installs both) fails where
    either is missing, a developer's machine skips."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        if os.environ.get("CI"):
            raise
        pytest.skip("playwright is not installed (pip install playwright)")
    if not Path(CHROMIUM).exists():
        if os.environ.get("CI"):
            raise FileNotFoundError("chromium is not installed (apt-get install chromium)")
        pytest.skip("chromium is not installed (apt-get install chromium)")
    return sync_playwright


def planted_history(path: Path) -> Path:
    """Nightlies of the real portable reference (DDP, PruneX, local SGD), judged against it
    as the nightly judges, each a commit of its own; from night STEP+1 PruneX sends 30 % more
    bytes and the gate says so; and a second class with fewer nights."""
    source = path.parent / "set"
    for folder in PORTABLE.iterdir():
        summary = folder / "summary.json"
        if summary.is_file() and json.loads(summary.read_text())["method"] in (
                "ddp", "prunex", "localsgd-hier"):
            shutil.copytree(folder, source / folder.name)
    rows = history_rows(source, None, judge_sets(REFERENCE, source))
    with path.open("w") as out:
        for machine, nights in (("cpu-gloo-portable-t1", NIGHTS), (OTHER, 6)):
            for night in range(nights):
                for row in rows:
                    day = f"2026-11-{night + 1:02d}T02:30:00+0000"
                    row = {**row, "machine_class": machine, "commit": f"c{night:03d}" * 4,
                           "when": day, "night": day, "verdicts": dict(row["verdicts"])}
                    if machine != OTHER and night >= STEP and row["method"] == "prunex":
                        row["inter_node_bytes_per_iteration"] *= 1.3
                        row["verdicts"]["inter_node_bytes_per_iteration"] = "REGRESSION"
                    out.write(json.dumps(row) + "\n")
    return path


TRACES = """() => Array.from(document.querySelectorAll('.js-plotly-plot')).flatMap(
    g => g.data.map(t => ({meta: t.meta, x: t.x, y: t.y, hover: t.hovertext || null})))"""


def test_the_dashboard_in_a_browser(tmp_path):
    sync_playwright = chromium()
    history = planted_history(tmp_path / "history.jsonl")
    site = tmp_path / "site"
    proc = subprocess.run([sys.executable, "-m", "suite.cli", "dashboard", history, "-o", site],
                          capture_output=True, text=True, env={**os.environ,
                                                               "PRUNEX_PROGRESS": "0"})
    assert proc.returncode == 0, proc.stderr
    errors, requests = [], []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        context = browser.new_context(offline=True)
        context.route(lambda url: not url.startswith("file:"),
                      lambda route: (requests.append(route.request.url), route.abort()))
        page = context.new_page()
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto((site / "index.html").as_uri())
        links = page.eval_on_selector_all("#classes a", "as => as.map(a => a.textContent)")
        assert sorted(links) == sorted(["cpu-gloo-portable-t1", OTHER])
        page.click("text=cpu-gloo-portable-t1")
        page.wait_for_function("document.querySelectorAll('.js-plotly-plot').length == 3")
        assert page.url.endswith(page_name("cpu-gloo-portable-t1"))
        # the last night's failures come first, before any figure
        first = page.evaluate("document.querySelector('#failures, .js-plotly-plot').id")
        assert first == "failures"
        failures = page.inner_text("#failures")
        assert "prunex" in failures and "REGRESSION" in failures
        traces = page.evaluate(TRACES)
        series = [t for t in traces if t["meta"]["kind"] == "series"]
        drawn = sorted((t["meta"]["method"], t["meta"]["metric"]) for t in series)
        assert drawn == sorted((m, k) for m in ("ddp", "localsgd-hier", "prunex") for k in PANELS)
        assert all(len(t["x"]) == NIGHTS for t in series)
        bytes_of_prunex = next(t for t in series if (t["meta"]["method"], t["meta"]["metric"])
                               == ("prunex", "inter_node_bytes_per_iteration"))
        assert "commit c005" in bytes_of_prunex["hover"][STEP]
        assert "verdict: REGRESSION" in bytes_of_prunex["hover"][STEP]
        assert "2026-11-06" in bytes_of_prunex["hover"][STEP]
        changes = [t for t in traces if t["meta"]["kind"] == "change"]
        assert [(t["meta"]["method"], t["meta"]["metric"]) for t in changes] == [
            ("prunex", "inter_node_bytes_per_iteration")]
        assert changes[0]["x"] == [bytes_of_prunex["x"][STEP]]
        assert {t["meta"]["kind"] for t in traces} >= {"band", "reference"}
        page.goto((site / page_name(OTHER)).as_uri())
        page.wait_for_function("document.querySelectorAll('.js-plotly-plot').length == 3")
        others = [t for t in page.evaluate(TRACES) if t["meta"]["kind"] == "series"]
        assert all(len(t["x"]) == 6 for t in others) and len(others) == 3 * len(PANELS)
        assert "none" in page.inner_text("#failures")
        browser.close()
    assert errors == [] and requests == []


def test_the_nightly_workflow_publishes_the_dashboard():
    """The workflow parses (a step name with a bare colon once broke it) and deploys the
    dashboard the nightly writes as the Pages site."""
    import yaml

    workflow = yaml.safe_load((REPO / ".github" / "workflows" / "nightly.yml").read_text())
    steps = workflow["jobs"]["nightly"]["steps"]
    uploads = [s for s in steps if s.get("uses", "").startswith("actions/upload-pages-artifact")]
    assert uploads and uploads[0]["with"]["path"] == "nightly-out/dashboard"
    assert workflow["jobs"]["pages"]["steps"][0]["uses"].startswith("actions/deploy-pages")


#: every text box a Plotly figure draws (titles, ticks), with its figure's index
TEXT_BOXES = """() => Array.from(document.querySelectorAll('.js-plotly-plot')).flatMap(
    (g, i) => Array.from(g.querySelectorAll('text')).filter(t => t.textContent.trim())
        .map(t => { const r = t.getBoundingClientRect();
                    return {plot: i, text: t.textContent, x0: r.left, y0: r.top,
                            x1: r.right, y1: r.bottom}; }))"""
#: the area of every band's fill on the page
FILLS = """() => Array.from(document.querySelectorAll('.js-plotly-plot path.js-fill')).map(
    p => { const r = p.getBoundingClientRect(); return r.width * r.height; })"""


def overlapping(boxes: list[dict]) -> list[tuple[str, str]]:
    """Pairs of text boxes of one figure that overlap (by more than a pixel each way)."""
    found = []
    for i, a in enumerate(boxes):
        for b in boxes[i + 1:]:
            if a["plot"] == b["plot"] and min(a["x1"], b["x1"]) - max(a["x0"], b["x0"]) > 1 \
                    and min(a["y1"], b["y1"]) - max(a["y0"], b["y0"]) > 1:
                found.append((a["text"], b["text"]))
    return found


def test_one_night_reads_right(tmp_path):
    """The dashboard after its first night: no text box over another (the time axis once drew
    sub-millisecond ticks into the next panel), no toolbar, the reference band drawn, headings
    in words, "1 nightly", and a time the gate did not judge drawn hollow."""
    sync_playwright = chromium()
    source = tmp_path / "set"
    for folder in PORTABLE.iterdir():
        summary = folder / "summary.json"
        if summary.is_file() and json.loads(summary.read_text())["method"] in ("ddp", "prunex"):
            shutil.copytree(folder, source / folder.name)
    rows = history_rows(source, METHODS.defaults,
                        judge_sets(REFERENCE, source, declared=METHODS.defaults))
    for row in rows:  # the gate did not judge the time of a busy night
        row["verdicts"]["time_ratio"] = "not judged: runner busy (load 1.2 on 2 cores)"
    history = tmp_path / "history.jsonl"
    history.write_text("".join(json.dumps(row) + "\n" for row in rows))
    site = tmp_path / "site"
    proc = subprocess.run([sys.executable, "-m", "suite.cli", "dashboard", history, "-o", site],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1250, "height": 900})
        page.goto((site / page_name("cpu-gloo-portable-t1")).as_uri())
        page.wait_for_function("document.querySelectorAll('.js-plotly-plot').length == 2")
        assert overlapping(page.evaluate(TEXT_BOXES)) == []
        assert page.locator(".modebar").count() == 0
        assert all(area > 100 for area in page.evaluate(FILLS)) and page.evaluate(FILLS)
        headings = page.eval_on_selector_all("h2", "hs => hs.map(h => h.textContent)")
        assert "prunex: channel keep 0.5, local steps 4" in headings, headings
        assert "1 nightly," in page.inner_text("p.note")
        series = [t for t in page.evaluate(TRACES) if t["meta"]["kind"] == "series"]
        judged = {t["meta"]["metric"]: t["meta"]["judged"] for t in series}
        assert judged["time_ratio"] == [False] and judged["final_train_loss"] == [True]
        browser.close()
