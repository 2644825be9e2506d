"""Bad input generated from the files' own declarations (suite.results.records and the gate's,
the history's and the profile's records): every field of every file the suite reads back is
given a value of a wrong type, left out, and given a value outside its range, and the command
that reads the file must end without a traceback (a traceback fails the test: the commands run
in this process with ``catch_exceptions=False``), with one line on stderr where it refuses.

The cases come from each record's JSON schema (pydantic), so a field declared later is
covered without a line here; tests/results/test_records.py holds every key of the schema to a
declared type."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner

from suite.cli import main
from suite.gate.thresholds import DEFAULT_GATE, GateFile
from suite.gate.trend import HistoryLine
from suite.results.records import Manifest, Summary
from suite.sim.profile import PROFILE_DIR, ProfileFile

REPO = Path(__file__).resolve().parents[2]
REFERENCE = REPO / "reference" / "cpu-gloo-portable-t1"
RUN = REFERENCE / "prunex-cnn-fmnist-4g-51b04d5e"
DENSE = REFERENCE / "ddp-cnn-fmnist-4g-4d0bbca3"
#: a value of each JSON type, to give a field one of a type it does not take
OF_TYPE = {"string": "abc", "integer": 7, "number": 1.5, "boolean": True, "array": [1],
           "object": {"a": 1}, "null": None}
DELETE = object()


@dataclass(frozen=True)
class Case:
    """One damage: the field at ``path`` (keys from the file's top) gets ``value``
    (``DELETE``: removed); ``kind`` is type, missing or range."""

    path: tuple[str, ...]
    kind: str
    value: object

    @property
    def name(self) -> str:
        return f"{'.'.join(self.path)}-{self.kind}"


def resolved(schema: dict, defs: dict) -> list[dict]:
    """The alternatives a property takes (``anyOf`` flattened, ``$ref`` looked up)."""
    options = schema.get("anyOf", [schema])
    out = []
    for option in options:
        if "$ref" in option:
            option = defs[option["$ref"].split("/")[-1]]
        out.append(option)
    return out


def wrong_type(options: list[dict]) -> object:
    """A value of a JSON type none of ``options`` takes (an integer is a number)."""
    taken = {o.get("type") for o in options} | ({"string"} if any("enum" in o for o in options)
                                                 else set())
    if "number" in taken:
        taken.add("integer")
    if not any(o.get("type") for o in options if "enum" not in o) and not taken - {None}:
        return None  # any JSON value (JsonValue): no type is wrong
    return next((value for kind, value in OF_TYPE.items() if kind not in taken), None)


def out_of_range(options: list[dict]) -> Iterator[object]:
    """Values just outside what ``options`` allow: below a minimum, above a maximum, a
    string longer than its limit, a list of the wrong length, a word not in an enum."""
    for o in options:
        if "minimum" in o:
            yield o["minimum"] - 1
        if "exclusiveMinimum" in o:
            yield o["exclusiveMinimum"]
        if "maximum" in o:
            yield o["maximum"] + 1
        if "exclusiveMaximum" in o:
            yield o["exclusiveMaximum"]
        if "maxLength" in o:
            yield "x" * (o["maxLength"] + 1)
        if o.get("minLength"):
            yield ""
        if "maxItems" in o and o["maxItems"] < 100:
            yield [1] * (o["maxItems"] + 1)
        if o.get("minItems"):
            yield []
        if "enum" in o:
            yield "not-one-of-them"


def cases(model, *, nested: bool = True) -> list[Case]:
    """Every field of ``model`` (and of the records it nests) damaged three ways."""
    schema = model.model_json_schema()
    defs = schema.get("$defs", {})
    found: list[Case] = []

    def walk(properties: dict, prefix: tuple[str, ...], depth: int) -> None:
        for key, prop in properties.items():
            path = (*prefix, key)
            options = resolved(prop, defs)
            found.append(Case(path, "missing", DELETE))
            bad = wrong_type(options)
            if bad is not None or "null" not in {o.get("type") for o in options}:
                found.append(Case(path, "type", bad))
            for i, value in enumerate(out_of_range(options)):
                found.append(Case(path, f"range{i}", value))
            inner = [o for o in options if o.get("type") == "object" and "properties" in o]
            if nested and inner and depth == 0:
                walk(inner[0]["properties"], path, depth + 1)

    walk(schema["properties"], (), 0)
    return found


def damaged(document: dict, case: Case) -> dict:
    """A copy of ``document`` with ``case`` applied (missing parents made)."""
    copy = json.loads(json.dumps(document))
    parent = copy
    for key in case.path[:-1]:
        if not isinstance(parent.get(key), dict):
            parent[key] = {}
        parent = parent[key]
    if case.value is DELETE:
        parent.pop(case.path[-1], None)
    else:
        parent[case.path[-1]] = case.value
    return copy


def invoke(*args):
    """``bench ARGS`` in this process: a traceback raises (and fails the test)."""
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


def ends_well(result) -> None:
    """No traceback got here; a refusal is one line."""
    assert result.exit_code in (0, 1, 2), result.output
    if result.exit_code == 2:
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        assert len(lines) == 1, result.stderr
        assert len(lines[0]) <= 2100, lines[0][:200]


SUMMARY_CASES = cases(Summary)
MANIFEST_CASES = cases(Manifest)
GATE_CASES = cases(GateFile)
HISTORY_CASES = cases(HistoryLine)
PROFILE_CASES = cases(ProfileFile)
ALL = [*SUMMARY_CASES, *MANIFEST_CASES, *GATE_CASES, *HISTORY_CASES, *PROFILE_CASES]


def test_the_generated_cases_cover_every_file_and_kind():
    """At least 200 cases, each kind of damage on each file (the count for the issue)."""
    assert len(ALL) >= 200, len(ALL)
    for group in (SUMMARY_CASES, MANIFEST_CASES, GATE_CASES, HISTORY_CASES, PROFILE_CASES):
        kinds = {case.kind[:5] for case in group}
        assert {"missi", "type", "range"} <= kinds, kinds


@pytest.fixture(scope="module")
def run_set(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("set")
    shutil.copytree(DENSE, root / DENSE.name)
    return root


def in_place(run_set: Path, file: str, document: dict) -> Path:
    """The reference run with ``file`` replaced by ``document``, beside the dense run."""
    run = run_set / RUN.name
    shutil.rmtree(run, ignore_errors=True)
    shutil.copytree(RUN, run)
    (run / file).write_text(json.dumps(document))
    return run


@pytest.mark.parametrize("case", SUMMARY_CASES, ids=[c.name for c in SUMMARY_CASES])
def test_a_damaged_summary_field_is_never_a_traceback(run_set, case):
    document = json.loads((RUN / "summary.json").read_text())
    run = in_place(run_set, "summary.json", damaged(document, case))
    ends_well(invoke("compare", run_set, run_set))
    ends_well(invoke("recover", run))


@pytest.mark.parametrize("case", MANIFEST_CASES, ids=[c.name for c in MANIFEST_CASES])
def test_a_damaged_manifest_field_is_never_a_traceback(run_set, tmp_path, case):
    document = json.loads((RUN / "manifest.json").read_text())
    run = in_place(run_set, "manifest.json", damaged(document, case))
    ends_well(invoke("compare", run_set, run_set))
    ends_well(invoke("rerun", run, "--dry-run", "--results-dir", tmp_path))


@pytest.fixture(scope="module")
def gate_set(tmp_path_factory) -> Path:
    """A reference of the portable class (two of its runs) and its gate.json."""
    root = tmp_path_factory.mktemp("gate") / "cpu-gloo-portable-t1"
    for run in (RUN, DENSE):
        shutil.copytree(run, root / run.name)
    return root


@pytest.mark.parametrize("case", GATE_CASES, ids=[c.name for c in GATE_CASES])
def test_a_damaged_gate_field_is_never_a_traceback(gate_set, case):
    document = {**DEFAULT_GATE, "metrics": list(DEFAULT_GATE["metrics"])}
    (gate_set / "gate.json").write_text(json.dumps(damaged(document, case)))
    ends_well(invoke("compare", gate_set, gate_set))


@pytest.fixture(scope="module")
def history_line(tmp_path_factory) -> dict:
    """One line of a real history: the reference's two runs added, judged against them."""
    root = tmp_path_factory.mktemp("history")
    for run in (RUN, DENSE):
        shutil.copytree(run, root / "set" / run.name)
    history = root / "h.jsonl"
    result = invoke("trend", history, "--add", root / "set", "--against", root / "set")
    assert result.exit_code == 0, result.output
    return json.loads(history.read_text().splitlines()[0])


@pytest.mark.parametrize("case", HISTORY_CASES, ids=[c.name for c in HISTORY_CASES])
def test_a_damaged_history_field_is_never_a_traceback(history_line, tmp_path, case):
    history = tmp_path / "h.jsonl"
    history.write_text(json.dumps(damaged(history_line, case)) + "\n")
    ends_well(invoke("trend", history))
    ends_well(invoke("dashboard", history, "-o", tmp_path / "site"))


@pytest.mark.parametrize("case", PROFILE_CASES, ids=[c.name for c in PROFILE_CASES])
def test_a_damaged_profile_field_is_never_a_traceback(tmp_path, case):
    document = json.loads((PROFILE_DIR / "cpu-2x2-1gbit.json").read_text())
    profile = tmp_path / "p.json"
    profile.write_text(json.dumps(damaged(document, case)))
    ends_well(invoke("run", "--launcher", "sim", "--profile", profile, "--method", "ddp",
                     "--gpus", "8", "--dry-run"))
