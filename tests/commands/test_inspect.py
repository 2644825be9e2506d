"""`bench inspect` on a built-in workload and on models by name, and a run of a model by name:
any timm or torchvision classifier without a plugin, checked before it costs a GPU hour."""

from __future__ import annotations

import json

import pytest

from tests.support.runs import TINY, bench, bench_here, summary


def test_inspect_a_builtin_says_what_its_keeps_reach():
    result = bench_here("inspect", "--workload", "cnn-fmnist")
    assert result.exit_code == 0, result.output
    out = result.output
    assert "cnn-fmnist at channel keep 0.5: the structured path works" in out
    for row in ("dense", "live (packed per frozen round)", "exported",
                "inter-node bytes per frozen round", "weights: conv"):
        assert row in out, out


def test_inspect_models_by_name_as_json():
    for model in ("timm:resnet10t", "torchvision:resnet18"):
        result = bench_here("inspect", "--model", model, "--channel-keep", "0.5", "--json")
        assert result.exit_code == 0, result.output
        found = json.loads(result.output)
        assert found["status"] == "ok" and found["reason"] is None, found
        assert 0 < found["live_parameters"] < found["dense_parameters"]
        assert 0 < found["packed_share"] < 1 and 0 < found["exported_share"] < 1


def test_a_refused_model_is_one_line_and_json_says_why():
    """A ViT at a channel keep: its only conv reads the image's one channel, so the keep
    prunes nothing; the advice of its JSON names what would."""
    plain = bench_here("inspect", "--workload", "vit-fmnist", "--channel-keep", "0.5")
    assert plain.exit_code == 2
    lines = [line for line in plain.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "refused" in lines[0] and "prunes nothing" in lines[0]
    assert "--head-keep" in lines[0] and "--mlp-keep" in lines[0]
    found = json.loads(bench_here("inspect", "--workload", "vit-fmnist", "--channel-keep", "0.5",
                                  "--json").output)
    assert found["status"] == "refused" and "prunes nothing" in found["reason"]
    reached = json.loads(bench_here("inspect", "--workload", "vit-fmnist", "--mlp-keep", "0.5",
                                    "--json").output)
    assert reached["status"] == "ok" and any("--head-keep" in a for a in reached["advice"])


def test_an_unknown_model_name_is_one_line_with_the_closest():
    result = bench_here("inspect", "--model", "timm:cspresnet5")
    assert result.exit_code == 2
    assert "timm has no model 'cspresnet5'; did you mean cspresnet50" in result.stderr
    listed = bench_here("list").output
    assert "timm:NAME" in listed and "torchvision:NAME" in listed


def test_a_model_by_name_runs_on_two_ranks(tmp_path):
    proc = bench("run", "--model", "timm:resnet10t", "--method", "prunex", *TINY, "--gpus", "2",
                 "--gpus-per-node", "1", "--iterations", "2", "--local-steps", "2",
                 "--results-dir", tmp_path, "--run-id", "by-name")
    assert proc.returncode == 0, proc.stderr
    done = summary(tmp_path / "by-name")
    assert done["status"] == "ok" and done["workload"] == "timm:resnet10t"
    manifest = json.loads((tmp_path / "by-name" / "manifest.json").read_text())
    assert manifest["model"] == "timm:resnet10t"


def test_inspect_hands_a_model_the_smallest_size_it_takes():
    """FasterNet-T0 does not run on Fashion-MNIST's 28x28 images: inspect finds 32x32, says
    so, and says where its seconds went."""
    result = bench_here("inspect", "--model", "timm:fasternet_t0")
    assert result.exit_code == 0, result.output
    assert result.output.startswith(
        "timm:fasternet_t0 at channel keep 0.5, on 32x32 images (the smallest size "
        "timm:fasternet_t0 takes; the dataset's are 28x28): the structured path works")
    found = json.loads(bench_here("inspect", "--model", "timm:fasternet_t0", "--image-size",
                                  "48", "--json").output)
    assert found["status"] == "ok"
    assert found["input_size"] == {"dataset_side": 28, "model_side": 48, "chosen": "given"}
    assert set(found["phases"]) == {"factory", "size", "build", "prepare", "trace", "masks",
                                    "export", "liveness"}
    assert abs(sum(found["phases"].values()) - found["seconds"]) < 1e-6


def test_list_browses_the_names_a_family_takes():
    import timm

    mixnets = bench_here("list", "--workloads", "timm:*mixnet*")
    assert mixnets.exit_code == 0, mixnets.output
    assert mixnets.output.split() == [f"timm:{name}" for name in timm.list_models("*mixnet*")]
    assert "timm:mixnet_s" in mixnets.output.split()
    vision = bench_here("list", "--workloads", "torchvision:*").output.split()
    assert "torchvision:resnet18" in vision and "torchvision:fasterrcnn_resnet50_fpn" not in vision
    both = bench_here("list", "--workloads", "*resnet18*").output.split()
    assert {"resnet18-fmnist", "timm:resnet18", "torchvision:resnet18"} <= set(both)
    unknown = bench_here("list", "--workloads", "keras:*")
    assert unknown.exit_code == 2
    assert unknown.stderr.strip() == ("Error: no workload family 'keras'; the families: timm, "
                                      "torchvision")


def sized_run(folder, method: str, *options):
    """A run of the small ViT (its patch embedding takes one image size only: a batch the
    ranks did not resize would stop it) at --image-size 40 on 32x32 synthetic images."""
    proc = bench("run", "--workload", "vit-fmnist", "--method", method, *options, *TINY,
                 "--gpus", "1", "--gpus-per-node", "1", "--iterations", "2", "--image-size",
                 "40", "--results-dir", folder, "--run-id", "sized")
    assert proc.returncode == 0, proc.stderr
    return proc


@pytest.mark.integration  # a real run of a minute: nox -s integration
def test_a_run_at_another_size_resizes_its_batches_and_says_so(tmp_path):
    proc = sized_run(tmp_path, "ddp")
    assert "; images resized from 32x32 to 40x40 (--image-size); results: " in proc.stdout
    manifest = json.loads((tmp_path / "sized" / "manifest.json").read_text())
    assert manifest["plan"]["input_size"] == {"dataset_side": 32, "model_side": 40,
                                              "chosen": "given"}
    assert manifest["plan"]["spec"]["image_size"] == 40 and manifest["config"]["image_size"] == 40


@pytest.mark.integration  # a run and an export's latency measurement: about a minute
def test_a_run_at_another_size_exports_at_its_size(tmp_path):
    sized_run(tmp_path, "prunex", "--mlp-keep", "0.5", "--channel-keep", "1",
              "--local-steps", "2")
    exported = bench("export", tmp_path / "sized", "--repeats", "3")
    assert exported.returncode == 0, exported.stderr
    record = json.loads((tmp_path / "sized" / "export.json").read_text())
    assert record["max_abs_diff_fp64"] <= record["tolerance"]
    assert 0 <= record["exported"]["test_accuracy"] <= 1


def test_a_given_size_the_model_does_not_take_is_one_line_before_any_rank():
    result = bench_here("run", "--model", "timm:fasternet_t0", "--method", "ddp", "--image-size",
                        "28", "--gpus", "2", "--gpus-per-node", "1", "--iterations", "1",
                        "--dry-run")
    assert result.exit_code == 2
    assert result.stderr.strip() == (
        "Error: timm:fasternet_t0 does not run on 1x28x28 images (RuntimeError: Calculated "
        "padded input size per channel: (1 x 1). Kernel size: (2 x 2). Kernel size can't be "
        "greater than actual input size); give a size it takes (--image-size), or none: the "
        "smallest it takes is found")
