"""The gate cannot pass what it did not judge: a committed reference recorded under other
defaults than the nightly runs today fails the suite; a method run under other settings than
its baseline fails `bench compare` in one line naming it; every nightly trains and adds one
night to the history; `bench trend` by hand judges at the thresholds the nightly did."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from methods.prunex.settings import PruneXSettings
from suite.api import option
from suite.commands.nightly import nightly_config, nightly_flags, stale_reference_lines
from suite.plugins.registry import METHODS

REPO = Path(__file__).resolve().parents[2]
REFERENCE = REPO / "reference"
PORTABLE = REFERENCE / "cpu-gloo-portable-t1"
STALE = REPO / "tests" / "fixtures" / "references" / "cpu-gloo-amd25-avx512-t1"
ENV = {**os.environ, "PRUNEX_PROGRESS": "0"}


def bench(*args, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "suite.cli", *map(str, args)],
                          capture_output=True, text=True, env=env or ENV, cwd=REPO)


def runs_of(source: Path, target: Path, methods=("ddp", "prunex", "localsgd-hier")) -> Path:
    """The runs of ``methods`` in ``source`` (a class's reference), copied."""
    for folder in sorted(source.iterdir()):
        summary = folder / "summary.json"
        if summary.is_file() and json.loads(summary.read_text())["method"] in methods:
            shutil.copytree(folder, target / folder.name)
    return target


def as_class_of(folder: Path, source: Path) -> None:
    """Record ``folder``'s runs as made on the machine of ``source``'s runs (its class)."""
    hardware = json.loads(next(source.glob("*/manifest.json")).read_text())["hardware"]
    for path in folder.rglob("manifest.json"):
        manifest = json.loads(path.read_text())
        manifest["hardware"] = hardware
        path.write_text(json.dumps(manifest))


# -- references follow the defaults ----------------------------------------------------------
def test_every_committed_reference_was_recorded_under_todays_defaults():
    """Each committed class's runs resolve to the plan the nightly runs today (method
    settings, recipe, schedule, dataset, layout); a default changed without `nox -s reference`
    fails here, naming the class and the method."""
    stale = stale_reference_lines(REFERENCE)
    assert stale == [], "\n".join(["re-record these classes with `nox -s reference`:", *stale])


def test_a_changed_default_makes_the_reference_stale(monkeypatch):
    """The same check with PruneX's freeze share default moved in the registry: the portable
    reference (recorded at 0.25) is stale for prunex alone, and the line says what moved."""
    @dataclass
    class Moved(PruneXSettings):
        freeze_share: float = option(0.4, "freeze the masks by this share of the budget")

    entry = METHODS.get("prunex")
    monkeypatch.setitem(METHODS._entries, "prunex", replace(entry, settings=Moved))
    stale = stale_reference_lines(REFERENCE, ["cpu-gloo-portable-t1"])
    assert len(stale) == 1, stale
    assert stale[0].startswith("cpu-gloo-portable-t1: prunex (prunex-cnn-fmnist-4g-")
    assert "freeze_share: recorded 0.25, today 0.4" in stale[0]


def test_an_older_recording_names_what_it_lacks():
    """The AMD class as committed before node averaging and the freeze share of 0.25."""
    lines = stale_reference_lines(STALE.parent, [STALE.name])
    prunex = [line for line in lines if ": prunex (" in line]
    assert prunex and "freeze_share: recorded 0.5, today 0.25" in prunex[0]
    assert "intra_average_period: not recorded (the option is newer), today 4" in prunex[0]


def test_the_nightly_flags_are_the_configuration_the_check_resolves(monkeypatch):
    monkeypatch.delenv("NIGHTLY_EPOCHS", raising=False)
    flags = nightly_flags()
    assert flags[flags.index("--epochs") + 1] == "0.1" and "--local-steps" in flags
    assert nightly_config("prunex").options == {"local_steps": 4}
    assert nightly_config("ddp").options == {}  # a sweep gives an option to its readers only
    monkeypatch.setenv("NIGHTLY_EPOCHS", "zero")
    with pytest.raises(Exception, match="NIGHTLY_EPOCHS='zero' must be a number of epochs"):
        nightly_flags()


# -- a method under other settings fails the gate --------------------------------------------
def test_a_method_under_other_settings_fails_in_one_line_naming_it(tmp_path):
    """NEW's runs on the class of a reference whose PruneX was recorded at --freeze-share 0.5:
    the gate fails naming prunex, the setting and `nox -s reference`; --allow-unmatched lists it
    instead; the other methods are judged as always."""
    tree = tmp_path / "reference"
    runs_of(STALE, tree / STALE.name)
    new = runs_of(PORTABLE, tmp_path / "new")
    as_class_of(new, STALE)
    proc = bench("compare", tree, new)
    assert proc.returncode == 1, proc.stdout
    named = [line for line in proc.stdout.splitlines() if "other settings" in line]
    assert len(named) == 1, proc.stdout
    assert "prunex ran under other settings than its baseline: freeze_share 0.5 in the " \
        "baseline, its default in NEW" in named[0]
    assert "`nox -s reference -- --replace`" in named[0] and STALE.name in named[0]
    assert "ddp " in proc.stdout and "train-loss" in proc.stdout  # ddp is still judged
    allowed = bench("compare", tree, new, "--allow-unmatched", "--metric", "bytes")
    assert "other settings" not in allowed.stdout
    assert "unmatched (only in new): [" in allowed.stdout
    data = json.loads(bench("compare", tree, new, "--format", "json").stdout)
    rows = [r for r in data["rows"] if r["metric"] == "settings"]
    assert [r["method"] for r in rows] == ["prunex"] and rows[0]["regression"]


def test_two_sets_of_other_classes_compare_nothing_and_name_both(tmp_path):
    """Neither set is a reference: no advice to record one, the two classes named; a
    simulated class is never told to record a reference."""
    cpu = runs_of(PORTABLE, tmp_path / "cpu", methods=("ddp",))
    other = runs_of(PORTABLE, tmp_path / "other", methods=("ddp",))
    as_class_of(other, STALE)
    proc = bench("compare", cpu, other)
    assert proc.returncode == 1
    line = proc.stderr.strip().splitlines()[-1]
    assert "nothing compared:" in line and "nox -s reference" not in line
    assert "cpu-gloo-portable-t1" in line and STALE.name in line
    sim = tmp_path / "sim"
    shutil.copytree(other, sim)
    for path in sim.rglob("manifest.json"):
        manifest = json.loads(path.read_text())
        manifest.update(simulated=True, simulation={"profile": {"name": "v100-ib100"}})
        path.write_text(json.dumps(manifest))
    proc = bench("compare", tree_of(tmp_path / "tree", cpu), sim)
    assert proc.returncode == 1 and "nox -s reference" not in proc.stderr, proc.stderr
    assert "sim-v100-ib100" in proc.stderr


def tree_of(root: Path, folder: Path) -> Path:
    """A reference tree holding ``folder`` as its class's folder."""
    shutil.copytree(folder, root / "cpu-gloo-portable-t1")
    return root


def test_the_compact_table_never_cuts_a_verdict(tmp_path):
    tree = tmp_path / "reference"
    runs_of(STALE, tree / STALE.name)
    new = runs_of(PORTABLE, tmp_path / "new")
    as_class_of(new, STALE)
    data = json.loads(bench("compare", tree, new, "--format", "json").stdout)
    text = bench("compare", tree, new).stdout
    for row in data["rows"]:  # options may be elided, a verdict never
        assert row["verdict"] in text, row["verdict"]


# -- one verdict by hand and by the nightly; one line per night -------------------------------
@pytest.mark.integration  # a real run of a minute: nox -s integration
def test_trend_by_hand_judges_at_the_thresholds_the_nightly_recorded(tmp_path):
    """The nightly's `bench trend --add --against` judges at the class's gate.json (a 30 %
    byte threshold here); `bench trend HISTORY` by hand reads those thresholds from the
    history and finds the same change points (none for a 20 % step), where bench compare's own
    5 % would find one."""
    tree = tmp_path / "reference"
    runs_of(PORTABLE, tree / PORTABLE.name)
    (tree / PORTABLE.name / "gate.json").write_text(json.dumps({"max_regression": "30%"}))
    history = tmp_path / "history.jsonl"
    nightly = bench("trend", history, "--add", tree / PORTABLE.name, "--against", tree)
    assert nightly.returncode == 0, nightly.stderr
    lines = [json.loads(line) for line in history.read_text().splitlines()]
    with history.open("w") as out:  # ten nights; PruneX sends 20 % more from the seventh
        for night in range(10):
            for line in lines:
                day = f"2026-11-{night + 1:02d}T02:30:00+0000"
                line = {**line, "night": day, "when": day, "commit": f"c{night:03d}"}
                if night >= 6 and line["method"] == "prunex":
                    line["inter_node_bytes_per_iteration"] *= 1.2
                out.write(json.dumps(line) + "\n")
    by_hand = bench("trend", history)
    again = bench("trend", history, "--against", tree)
    for proc in (by_hand, again):
        assert proc.returncode == 0, proc.stderr
        assert "bytes 30.0%" in proc.stdout and "as the history's last judged night" in \
            proc.stdout, proc.stdout
        assert "0 change point(s) in all" in proc.stdout
    lower = bench("trend", history, "--max-regression", "5%")
    assert "1 change point(s) in all" in lower.stdout, lower.stdout


def test_a_set_added_twice_is_one_night(tmp_path):
    history = tmp_path / "history.jsonl"
    for _ in range(2):
        assert bench("trend", history, "--add", PORTABLE).returncode == 0
    lines = [json.loads(line) for line in history.read_text().splitlines()]
    assert len(lines) == 11 and len({line["night"] for line in lines}) == 1


@pytest.mark.integration
def test_every_nightly_trains_and_is_a_night_of_its_own(tmp_path):
    """`nox -s nightly` three times (DDP at a hundredth of an epoch, against a reference
    recorded so): twice at one commit, once after a new one. Each trains its cell (no
    'skipped'), the history holds three nights of one line each, and the third names the new
    commit."""
    git = tmp_path / "git"  # the commit the runs record: a repository of the test's own
    subprocess.run(["git", "init", "-q", str(git)], check=True)

    def commit() -> str:
        subprocess.run(["git", "-C", str(git), "-c", "user.name=t", "-c", "user.email=t@t",
                        "commit", "-q", "--allow-empty", "-m", "night"], check=True)
        return subprocess.run(["git", "-C", str(git), "rev-parse", "HEAD"], text=True,
                              capture_output=True, check=True).stdout.strip()

    first = commit()
    env = {**ENV, "NIGHTLY_EPOCHS": "0.01", "NIGHTLY_METHODS": "ddp", "NIGHTLY_DIR":
           str(tmp_path / "out"), "NIGHTLY_REFERENCE": str(tmp_path / "reference"),
           "NIGHTLY_STAGING": str(tmp_path / "staging"), "GIT_DIR": str(git / ".git")}
    for name in ("NIGHTLY_SEEDS", "NIGHTLY_HISTORY", "ATEN_CPU_CAPABILITY"):
        env.pop(name, None)

    def nox(session: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "nox", "-s", session], cwd=REPO, env=env,
                              capture_output=True, text=True, timeout=600)

    recorded = nox("reference")
    assert recorded.returncode == 0, recorded.stdout + recorded.stderr
    logs = [nox("nightly"), nox("nightly")]
    second = commit()
    logs.append(nox("nightly"))
    for proc in logs:
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "1 done, 0 skipped, 0 failed" in proc.stdout + proc.stderr  # it trained
    history = [json.loads(line) for line in
               (tmp_path / "out" / "history.jsonl").read_text().splitlines()]
    assert len(history) == 3 and len({line["night"] for line in history}) == 3
    assert [line["commit"] for line in history] == [first, first, second]


#: the nightly's methods when a tuple in suite/gate/reference.py listed them (issue 65)
FORMER_NIGHTLY = ("prunex", "prunex-flat", "ddp", "ddp-bf16", "ddp-fp16", "powersgd", "topk",
                  "topk-hier", "localsgd-hier", "gmp-hier", "prune-retrain")


def test_the_nightly_is_the_methods_registered_for_it():
    """Methods join the nightly by registering with ``nightly=True``, in the order they
    registered: the built-ins are the former list, the methods every committed reference
    holds."""
    from suite.gate.reference import class_folders, reference_methods
    from suite.plugins.registry import Registry

    nightly = METHODS.nightly()
    assert sorted(nightly) == sorted(FORMER_NIGHTLY) and len(set(nightly)) == len(nightly)
    for machine, folder in class_folders(REFERENCE).items():
        assert reference_methods(folder, order=nightly) == nightly, machine
    registry = Registry("method", "prunex_bench.none")
    for name, joins in (("b", True), ("c", False), ("a", True)):
        registry.register(name, f"method {name}", nightly=joins)(lambda ctx: None)
    assert registry.nightly() == ("b", "a")
