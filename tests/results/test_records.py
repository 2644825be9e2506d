"""The typed records of the files the suite reads back: every key the schema declares has a
type, every committed run folder reads as valid, and a wrong field is one bounded line naming
the file and the field."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import pytest

from suite.config import RunConfig
from suite.results import records, schema
from suite.results.records import DamagedFile, read_record

REPO = Path(__file__).resolve().parents[2]


def test_every_summary_and_manifest_key_has_a_type():
    assert set(records.SUMMARY_FIELDS) == set(schema.SUMMARY_FILE_KEYS)
    assert set(records.MANIFEST_FIELDS) == set(schema.MANIFEST_FILE_KEYS)
    config = records.MANIFEST_FIELDS[schema.CONFIG]
    assert set(config.model_fields) == {f.name for f in dataclasses.fields(RunConfig)}


@pytest.mark.parametrize("name", ["summary.json", "manifest.json"])
def test_every_committed_run_folder_reads_as_valid(name):
    kind = records.Summary if name == "summary.json" else records.Manifest
    files = [p for p in REPO.glob(f"**/{name}") if ".git" not in p.parts]
    assert len(files) >= 50
    for path in files:
        read_record(path, kind, what=name)


def test_a_wrong_field_is_one_bounded_line(tmp_path):
    path = tmp_path / "summary.json"
    path.write_text(json.dumps({"status": "ok", "method": "ddp", "gpus": "x" * 100_000}))
    with pytest.raises(DamagedFile) as caught:
        read_record(path, records.Summary, what="summary")
    text = str(caught.value)
    assert text.startswith(f"{path}: gpus: should be a valid integer") and "\n" not in text
    assert len(text) < 300


def test_a_string_is_never_read_as_a_number(tmp_path):
    path = tmp_path / "summary.json"
    path.write_text(json.dumps({"iterations": "12"}))
    with pytest.raises(DamagedFile, match="iterations: should be a valid integer"):
        read_record(path, records.Summary, what="summary")


@pytest.mark.parametrize("make", ["fifo", "folder", "device", "huge", "binary", "deep"])
def test_only_a_regular_bounded_text_file_is_read(tmp_path, make):
    path = tmp_path / "summary.json"
    said = {"fifo": "not a regular file (a FIFO)", "folder": "not a regular file (a folder)",
            "device": "not a regular file (a device)", "huge": "more than a summary holds",
            "binary": "not text", "deep": "nested too deeply"}[make]
    if make == "fifo":
        os.mkfifo(path)
    elif make == "folder":
        path.mkdir()
    elif make == "device":
        path.symlink_to("/dev/zero")
    elif make == "huge":
        with path.open("wb") as handle:
            handle.truncate(records.MAX_RECORD_BYTES + 1)
    elif make == "binary":
        path.write_bytes(b"\xff\xfe\x00garbage")
    else:
        path.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(DamagedFile) as caught:
        read_record(path, records.Summary, what="summary")
    assert said in str(caught.value)


def test_a_missing_file_is_not_damage(tmp_path):
    with pytest.raises(FileNotFoundError):
        read_record(tmp_path / "none.json", records.Summary, what="summary")


@pytest.mark.parametrize(("field", "edge"), [(schema.SEED, "MAX_SEED"), (schema.GPUS, "MAX_RANKS")])
def test_what_bench_run_accepts_a_manifest_may_record(field, edge):
    """The plan's range and the manifest's type share one bound (suite.config): a run started
    at the edge is read back, one past it is refused by both."""
    from suite import config as bounds
    from suite.errors import BenchError
    from suite.run.plan import check_config

    manifest = json.loads(next(p for p in REPO.glob("**/manifest.json")
                               if ".git" not in p.parts).read_text())
    limit = getattr(bounds, edge)
    for value, accepted in ((limit, True), (limit + 1, False)):
        changes = {field: value, schema.GPUS_PER_NODE: 1} if field == schema.GPUS else {
            field: value}
        config = dataclasses.replace(RunConfig(method="ddp"), **changes)
        manifest[schema.CONFIG].update(changes)
        if accepted:
            check_config(config) if field == schema.SEED else None  # 2**20 ranks: no layout
            records.validate(manifest, records.Manifest, where="manifest.json")
        else:
            with pytest.raises(BenchError, match=f"(in \\[0, |at most ){limit}"):
                check_config(config)
            with pytest.raises(DamagedFile):
                records.validate(manifest, records.Manifest, where="manifest.json")
