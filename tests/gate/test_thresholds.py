"""The gate's thresholds have one home (suite.gate.thresholds): each metric of the catalogue
names the ``Gate`` field that judges it, no other module of the suite but the command line
spells a threshold's key, and a metric with a threshold of its own is one catalogue row and
one ``Gate`` field, read from gate.json, overridden by a flag and kept in the history with no
other change."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import pytest
from pydantic import ValidationError

from suite.errors import BenchError
from suite.gate import compare
from suite.gate.compare import judge
from suite.gate.thresholds import (
    DEFAULT,
    DEFAULT_GATE,
    GENERIC,
    RELATIVE,
    Gate,
    flag_thresholds,
    history_record,
    read_gate,
    threshold,
    write_gate,
)
from suite.results import schema
from suite.results.catalogue import BY_NAME, CATALOGUE, TIME_RATIO, Metric

REPO = Path(__file__).resolve().parents[2]
#: the modules that may spell a threshold's key: its declaration and the flags' declarations
ALLOWED = {"suite/gate/thresholds.py", "suite/cli.py"}


def spelled_keys(root: Path, keys: list[str]) -> list[str]:
    """``module: key`` for each module under ``root`` that spells one of ``keys`` (as grep
    would find it: in a string, a name or a comment)."""
    pattern = re.compile("|".join(re.escape(key) for key in keys))
    found = []
    for path in sorted(root.rglob("*.py")):
        module = str(path.relative_to(root.parent))
        for key in sorted(set(pattern.findall(path.read_text()))):
            found.append(f"{module}: {key}")
    return found


def threshold_keys() -> list[str]:
    return [f.metadata["key"] for f in Gate.thresholds()]


def test_no_module_but_the_thresholds_and_the_cli_spells_a_threshold():
    spelled = [line for line in spelled_keys(REPO / "suite", threshold_keys())
               if line.split(":")[0] not in ALLOWED]
    assert not spelled, "threshold keys spelled outside suite.gate.thresholds:\n" + (
        "\n".join(spelled))


def test_the_scan_finds_a_spelled_threshold(tmp_path):
    (tmp_path / "suite" / "gate").mkdir(parents=True)
    (tmp_path / "suite" / "gate" / "trend.py").write_text(
        'limit = gate["max_loss_regression"]  # or max_regression\n')
    assert spelled_keys(tmp_path / "suite", threshold_keys()) == [
        "suite/gate/trend.py: max_loss_regression", "suite/gate/trend.py: max_regression"]


def test_every_metric_is_judged_by_a_threshold_of_the_gate():
    judging = {f.name for f in Gate.thresholds() if f.metadata["words"] is not None}
    assert {metric.name: metric.threshold for metric in CATALOGUE
            if metric.threshold not in judging} == {}


def test_each_metric_keeps_the_threshold_it_was_judged_with():
    """The limits the four rule sites gave before the thresholds had a home: accuracy by its
    points, the training loss by its own, every time by the time threshold, bytes by the
    general one; and gate.json's defaults as they were written."""
    limits = {name: DEFAULT.limit(name) for name in BY_NAME}
    assert limits == {schema.FINAL_ACCURACY: 5.0, schema.FINAL_TRAIN_LOSS: 0.02,
                      TIME_RATIO: 0.15, schema.ITERATION_SECONDS: 0.15,
                      schema.TIME_TO_TARGET_SECONDS: 0.15,
                      schema.INTER_NODE_BYTES_PER_ITERATION: 0.05}
    assert {name: GENERIC.limit(name) for name in BY_NAME} == {
        **dict.fromkeys(BY_NAME, 0.05), schema.FINAL_ACCURACY: 1.0}
    assert DEFAULT_GATE == {"max_accuracy_drop": 5.0, "max_loss_regression": "2%",
                            "max_regression": "5%", "max_time_regression": "15%",
                            "max_outside_load": "25%",
                            "metrics": ["accuracy", "train-loss", "bytes", "time-ratio"]}
    assert DEFAULT.describe() == ("accuracy 5 points, training loss 2.0%, bytes 5.0%, time 15.0% "
                                  "on a runner at most 25% busy (the gate's defaults)")


def test_a_written_gate_reads_back_the_same(tmp_path):
    measured = Gate(accuracy_drop=1.4, loss_regression=0.07, time_regression=0.23)
    write_gate(tmp_path, measured, {"nightlies": 5})
    document = json.loads((tmp_path / "gate.json").read_text())
    assert document["max_time_regression"] == "23%" and document["measured"] == {"nightlies": 5}
    again = read_gate(tmp_path)
    assert (again.accuracy_drop, again.loss_regression, again.time_regression,
            again.regression, again.metrics) == (1.4, 0.07, 0.23, 0.05, DEFAULT.metrics)
    assert again.source == f"{tmp_path.name}/gate.json"


def test_a_flag_names_itself_when_refused():
    with pytest.raises(BenchError, match=r"^--max-time-regression 'lots' is not a fraction"):
        flag_thresholds(max_time_regression="lots")
    with pytest.raises(BenchError, match=r"^--max-accuracy-drop must be in \[0, 100\] points"):
        flag_thresholds(max_accuracy_drop=101.0)


#: the new metric of the next test: energy per iteration, with a threshold of its own
ENERGY = Metric("joules_per_iteration", "energy", "joules per iteration", -1,
                threshold="energy_regression")


@dataclass(frozen=True)
class EnergyGate(Gate):
    """The one field a metric with a threshold of its own adds."""

    energy_regression: float = threshold("max_energy_regression", 0.1, "energy")


def test_a_new_metric_with_its_own_threshold_is_one_row_and_one_field(tmp_path, monkeypatch):
    """The row (in the indexes the catalogue's rows make at import) and the field (a Gate
    with one more): gate.json, the command line, the verdict line, the judging and the
    history all follow."""
    monkeypatch.setitem(BY_NAME, ENERGY.name, ENERGY)
    monkeypatch.setitem(compare.METRICS, ENERGY.name, ENERGY.direction)
    (tmp_path / "gate.json").write_text(json.dumps({"max_energy_regression": "12%"}))
    gate = read_gate(tmp_path, EnergyGate)
    assert gate.limit(ENERGY.name) == pytest.approx(0.12)
    assert gate.limit(schema.FINAL_TRAIN_LOSS) == 0.02  # the others keep theirs
    assert "energy 12.0%" in gate.describe()
    before = {"mean": 10.0, "half": float("nan"), "n": 1}
    after = {"mean": 11.5, "half": float("nan"), "n": 1}
    assert judge(ENERGY.name, before, after, gate.limit(ENERGY.name))[2].name == "REGRESSION"
    loose = gate.overridden(flag_thresholds(EnergyGate, max_energy_regression="20%"))
    assert judge(ENERGY.name, before, after, loose.limit(ENERGY.name))[2].name == "OK"
    assert loose.source.endswith("--max-energy-regression from the command line")
    kept = loose.as_history()
    assert kept["max_energy_regression"] == pytest.approx(0.2)
    assert EnergyGate.from_history(kept).energy_regression == pytest.approx(0.2)
    # a history line written before the threshold existed: judged at its default
    older = {k: v for k, v in kept.items() if k != "max_energy_regression"}
    assert EnergyGate.from_history(older).energy_regression == 0.1
    assert loose.as_file()["max_energy_regression"] == "20%"


# -- gate.json as a class's maintainer writes it ----------------------------------------------
def test_a_null_outside_load_means_always_judged_and_an_absent_one_the_default(tmp_path):
    """gate.json's ``"max_outside_load": null`` judges times on any runner (None); leaving the
    key out takes the default's quarter of the cores; the two stay apart through a written
    gate and a history line."""
    (tmp_path / "gate.json").write_text(json.dumps({"max_outside_load": None}))
    always = read_gate(tmp_path)
    assert always.outside_load is None and "busy" not in always.describe()
    (tmp_path / "gate.json").write_text(json.dumps({"max_regression": "5%"}))
    assert read_gate(tmp_path).outside_load == 0.25
    write_gate(tmp_path, Gate(outside_load=None), {"nightlies": 5})
    assert json.loads((tmp_path / "gate.json").read_text())["max_outside_load"] is None
    assert read_gate(tmp_path).outside_load is None
    assert Gate.from_history(always.as_history()).outside_load is None


def test_a_null_threshold_that_is_always_a_number_is_refused_naming_it(tmp_path):
    """Null for a threshold None means nothing to is not read as the default an absent key
    takes: one line naming the key."""
    (tmp_path / "gate.json").write_text(json.dumps({"max_time_regression": None}))
    with pytest.raises(BenchError, match=r"gate\.json: max_time_regression: null, but it is "
                       r"always a number \(leave it out for the default, 0\.15\)$") as refused:
        read_gate(tmp_path)
    assert "\n" not in str(refused.value)


RELATIVE_KEYS = [f.metadata["key"] for f in Gate.thresholds() if f.metadata["unit"] == RELATIVE]


@pytest.mark.parametrize("key", RELATIVE_KEYS)
@pytest.mark.parametrize("value", ["lots", "2000%", True, "9" * 41])
def test_a_refused_threshold_in_gate_json_names_its_own_key(tmp_path, key, value):
    """Each relative threshold's refusal names that key, never another's (the parser once
    said --max-regression for all) nor a part of its type (``max_regression.float``)."""
    (tmp_path / "gate.json").write_text(json.dumps({key: value}))
    with pytest.raises(BenchError) as refused:
        read_gate(tmp_path)
    said = str(refused.value)
    assert said.startswith(f"{tmp_path / 'gate.json'}: {key}") and "\n" not in said, said
    named = [other for other in threshold_keys() if re.search(rf"\b-*{other}\b", said)]
    assert named == [key] and f"{key}." not in said, said


@pytest.mark.parametrize("key", RELATIVE_KEYS)
def test_a_refused_threshold_flag_names_its_own_flag(key):
    flag = "--" + key.replace("_", "-")
    with pytest.raises(BenchError, match=rf"^{flag} 'lots' is not a fraction or percentage$"):
        flag_thresholds(**{key: "lots"})


def test_points_over_a_hundred_are_bounded_when_written_and_refused_when_read(tmp_path):
    """A measured gate allows at most all the accuracy (100 points) and 1000 %; a gate.json or
    history line that says more is refused in one line naming it."""
    wild = Gate(accuracy_drop=139.2, loss_regression=15.2, time_regression=0.2).bounded()
    assert (wild.accuracy_drop, wild.loss_regression, wild.time_regression) == (100, 10, 0.2)
    write_gate(tmp_path, wild, {})
    assert read_gate(tmp_path).accuracy_drop == 100
    (tmp_path / "gate.json").write_text(json.dumps({"max_accuracy_drop": 100.5}))
    with pytest.raises(BenchError, match=r"gate\.json: max_accuracy_drop: should be less than "
                       r"or equal to 100 \(got 100\.5\)$"):
        read_gate(tmp_path)
    kept = {**DEFAULT.as_history(), "max_accuracy_drop": 150.0}
    with pytest.raises(ValidationError, match="max_accuracy_drop"):
        history_record().model_validate(kept)
