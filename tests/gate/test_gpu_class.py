"""A GPU machine class the project's lent machines can have (one GPU shared by the nightly's
ranks), the software a class's reference was recorded under, and a recording that never
replaces a reference by accident. CUDA is absent here: the facts a GPU would give are passed
in."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from suite.commands.nightly import nightly_flags
from suite.errors import BenchError
from suite.gate import kernels_repeat, plan_nightly, record_reference, this_machine_class
from suite.gate.reference import CLASS_FILE, reference_seeds, version_differences
from suite.results.folder import versions
from suite.results.machine import gpu_class, machine_class, ranks_on_cuda

REPO = Path(__file__).resolve().parents[2]
REFERENCE = REPO / "reference" / "cpu-gloo-portable-t1"
H200 = {"device_name": "NVIDIA H200", "compute_capability": "9.0"}


def test_ranks_sharing_a_gpu_are_a_class_of_their_own():
    assert gpu_class(H200, 4, 1) == "cuda-gloo-h200-sm90-x4"  # the lent machine: 4 ranks, 1 GPU
    assert gpu_class(H200, 4, 2) == "cuda-gloo-h200-sm90-x2"
    assert gpu_class(H200, 4, 4) == "cuda-nccl-h200-sm90"  # a GPU per rank: the class it was
    shared = {"device": "cuda:0", "backend": "gloo", "numerics": H200,
              "gpu_sharing": {"local_ranks": 4, "gpus": 1, "ranks_per_gpu": 4}}
    assert machine_class(shared) == gpu_class(H200, 4, 1)  # what its runs record
    # the launcher's placement rule, the one every caller imports
    assert ranks_on_cuda("cuda", 4, visible=1) and not ranks_on_cuda("auto", 4, visible=1)
    assert ranks_on_cuda("auto", 4, visible=4) and not ranks_on_cuda("cpu", 4, visible=4)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without CUDA")
def test_a_cuda_class_without_cuda_is_refused_in_one_line(monkeypatch):
    with pytest.raises(BenchError, match="no CUDA device is visible"):
        this_machine_class(4, "cuda")
    monkeypatch.setenv("NIGHTLY_DEVICE", "gpu")
    with pytest.raises(BenchError, match="NIGHTLY_DEVICE='gpu' must be one of auto, cpu, cuda"):
        nightly_flags()
    monkeypatch.setenv("NIGHTLY_DEVICE", "cpu")
    flags = nightly_flags()
    assert flags[flags.index("--device") + 1] == "cpu" and "--deterministic" not in flags
    monkeypatch.setenv("NIGHTLY_DEVICE", "cuda")
    assert "--deterministic" in nightly_flags()  # the GPU nightly's kernels repeat


def staged(tmp_path: Path) -> Path:
    """Real finished runs of the portable class, as `nox -s reference` leaves them."""
    staging = tmp_path / "staging"
    for method in ("ddp", "prunex"):
        run = next(REFERENCE.glob(f"{method}-cnn-*"))
        shutil.copytree(run, staging / run.name)
    return staging


def test_recording_never_replaces_a_reference_by_accident(tmp_path):
    staging, root = staged(tmp_path), tmp_path / "reference"
    with pytest.raises(BenchError, match="recorded class cpu-gloo-portable-t1, not the "
                       "cuda-gloo-h200-sm90-x4 this recording was started for"):
        record_reference(staging, root, ("ddp", "prunex"), expected="cuda-gloo-h200-sm90-x4")
    other = root / "cpu-gloo-portable-t1"
    other.mkdir(parents=True)
    (other / "gate.json").write_text('{"max_accuracy_drop": 3.0}\n')
    with pytest.raises(BenchError, match=r"exists: `nox -s reference -- --replace` replaces"):
        record_reference(staging, root, ("ddp", "prunex"), expected="cpu-gloo-portable-t1")
    assert [p.name for p in other.iterdir()] == ["gate.json"] and staging.is_dir()
    target = record_reference(staging, root, ("ddp", "prunex"), replace=True)
    record = json.loads((target / CLASS_FILE).read_text())
    manifest = json.loads(next(target.glob("ddp-*/manifest.json")).read_text())
    assert record["versions"]["torch"] == manifest["versions"]["torch"]
    assert (target / "gate.json").read_text() == '{"max_accuracy_drop": 3.0}\n'
    assert kernels_repeat(target) and reference_seeds(target) == (0,)


def test_a_reference_recorded_under_other_software_is_not_judged_against(tmp_path, monkeypatch):
    """A re-imaged GPU machine (another torch, CUDA or driver) would be judged against
    numbers it cannot repeat: the nightly refuses in one line before it runs. A CPU class is
    one any CPU runner joins (the portable one), whatever its torch build or driver."""
    import suite.gate.reference as reference

    today = versions()
    record = {"versions": {"torch": today["torch"], "cuda_driver": "535.54.03"}}
    for name in ("cuda-gloo-h200-sm90-x4", this_machine_class(4)):
        folder = tmp_path / name
        for method in ("ddp", "prunex"):
            run = next(REFERENCE.glob(f"{method}-cnn-*"))
            shutil.copytree(run, folder / run.name)
        (folder / CLASS_FILE).write_text(json.dumps({"class": name, **record}))
    assert plan_nightly(tmp_path, 4).machine_class == this_machine_class(4)  # CPU: joined
    gpu = tmp_path / "cuda-gloo-h200-sm90-x4"
    assert version_differences(gpu, today) == [
        f"cuda_driver: recorded 535.54.03, here {today['cuda_driver']}"]
    assert version_differences(gpu, {**today, "cuda_driver": "535.54.03"}) == []
    # the driver by its branch: a patch release of 535 joins, 580 does not
    assert version_differences(gpu, {**today, "cuda_driver": "535.104.05"}) == []
    assert version_differences(gpu, {**today, "cuda_driver": "580.159.04"}) == [
        "cuda_driver: recorded 535.54.03, here 580.159.04"]
    assert version_differences(gpu, {**today, "cuda_driver": "535.1.1", "torch": "0.0.1"}) == [
        f"torch: recorded {today['torch']}, here 0.0.1"]  # the rest whole
    monkeypatch.setattr(reference, "this_machine_class", lambda gpus, device: gpu.name)
    with pytest.raises(BenchError, match=r"recorded under other software than this runner's "
                       r"\(cuda_driver: recorded 535.54.03.*--replace"):
        plan_nightly(tmp_path, 4, device="cuda")
