"""`bench inspect` on a built-in workload and on models by name, and a run of a model by name:
any timm or torchvision classifier without a plugin, checked before it costs a GPU hour."""

from __future__ import annotations

import json

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
