"""Transformers' structured groups: attention heads and MLP neurons traced from the graph,
their projection (the exact Euclidean one, against a brute-force minimization), a pruned ViT
exported output-equal and physically smaller, PruneX sending exactly the live weights of the
agreed masks, and a keep that prunes nothing refused before any rank starts."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from timm.models.vision_transformer import VisionTransformer

from suite.structured.export import export_model
from suite.structured.masks import keep_count
from suite.structured.units import (
    UnitMask,
    apply_units,
    project_units,
    trace_unit_groups,
    unit_norms,
)
from tests.support.distributed import run_ranks
from tests.support.helpers import make_context, run_iterations
from tests.support.runs import bench, one_line_error

EXAMPLE = torch.zeros(1, 1, 8, 8)
HEADS, WIDTH, HIDDEN = 4, 16, 32


def tiny_vit() -> VisionTransformer:
    """A ViT for the helpers' 1x8x8 images: 4 patches of 4x4, 2 blocks of 4 heads."""
    torch.manual_seed(0)
    return VisionTransformer(img_size=8, patch_size=4, in_chans=1, num_classes=4,
                             embed_dim=WIDTH, depth=2, num_heads=HEADS, mlp_ratio=2.0)


def test_heads_and_neurons_are_traced_from_the_graph():
    groups = trace_unit_groups(tiny_vit(), EXAMPLE)
    assert [(g.key, g.units) for g in groups] == [
        ("blocks.0.attn#heads", HEADS), ("blocks.0.mlp#neurons", HIDDEN),
        ("blocks.1.attn#heads", HEADS), ("blocks.1.mlp#neurons", HIDDEN),
    ]
    heads = groups[0]
    qkv, bias, proj = heads.slices
    width = WIDTH // HEADS
    assert (qkv.param, qkv.dim, proj.param, proj.dim) == (
        "blocks.0.attn.qkv.weight", 0, "blocks.0.attn.proj.weight", 1)
    # head 1: its q, k and v rows of the fused projection, and the columns that read it
    assert qkv.index[1].tolist() == [part * WIDTH + width + i for part in range(3)
                                     for i in range(width)]
    assert torch.equal(bias.index, qkv.index)
    assert proj.index[1].tolist() == list(range(width, 2 * width))
    mlp = groups[1]
    assert [(s.param, s.dim) for s in mlp.slices] == [
        ("blocks.0.mlp.fc1.weight", 0), ("blocks.0.mlp.fc1.bias", 0),
        ("blocks.0.mlp.fc2.weight", 1)]
    from tests.support.helpers import TinyCNN

    assert trace_unit_groups(TinyCNN(bn=True), EXAMPLE) == []


@pytest.mark.parametrize("kind", ["head", "neuron"])
def test_the_unit_projection_is_the_nearest_point_with_k_units(kind):
    """Among every choice of k kept units, zeroing the others, none is closer to the
    original tensors than what project_units returns (and it keeps exactly k)."""
    group = next(g for g in trace_unit_groups(tiny_vit(), EXAMPLE) if g.kind == kind)
    units = min(group.units, 8)  # brute force over 8 of the neurons
    g = torch.Generator().manual_seed(1)
    original = {s.param: torch.randn(*shape, generator=g) for s, shape in
                ((s, shape_of(s)) for s in group.slices)}
    if units < group.units:  # only the first 8 neurons are nonzero: the others tie at zero
        for part in group.slices:
            original[part.param].index_fill_(part.dim, part.index[units:].reshape(-1), 0)
    keep = 0.5
    k = keep_count(group.units, keep)
    projected = {n: t.clone() for n, t in original.items()}
    mask = project_units(group, projected, keep)
    assert int(mask.kept.sum()) == k

    def distance(tensors) -> float:
        return sum(float((tensors[n] - original[n]).square().sum()) for n in original)

    best = math.inf
    candidates = itertools.combinations(range(units), min(k, units))
    for kept in candidates:
        bits = torch.zeros(group.units, dtype=torch.bool)
        bits[list(kept)] = True
        bits[units:] = k > units  # neurons beyond the brute-forced ones are zero anyway
        trial = {n: t.clone() for n, t in original.items()}
        apply_units(group, UnitMask(bits), trial)
        best = min(best, distance(trial))
    assert distance(projected) == pytest.approx(best, rel=1e-6)
    assert not unit_norms(group, projected)[~mask.kept].any()  # the others are zero


def shape_of(part) -> torch.Size:
    return dict(tiny_vit().named_parameters())[part.param].shape


def test_a_pruned_vit_exports_output_equal_and_smaller():
    model = tiny_vit().eval()
    groups = trace_unit_groups(model, EXAMPLE)
    g = torch.Generator().manual_seed(2)
    masks = {}
    for group in groups:
        kept = torch.zeros(group.units, dtype=torch.bool)
        kept[torch.randperm(group.units, generator=g)[: group.units // 2]] = True
        masks[group.key] = UnitMask(kept)
    images = torch.randn(64, 1, 8, 8, generator=g)
    masked, exported, live = export_model(model, masks, images, groups)
    with torch.no_grad():
        assert (exported(images) - masked(images)).abs().max() <= 1e-5
    assert exported.blocks[0].attn.num_heads == HEADS // 2
    assert exported.blocks[0].attn.qkv.weight.shape == (3 * WIDTH // 2, WIDTH)
    assert exported.blocks[0].mlp.fc1.weight.shape == (HIDDEN // 2, WIDTH)
    params = sum(p.numel() for p in exported.parameters())
    assert params == live.parameters < sum(p.numel() for p in model.parameters())


def vit_worker(rank):
    from methods.prunex.method import PruneX

    ctx = make_context(rank, gpus_per_node=2, method="prunex", model_fn=tiny_vit,
                       options={"head_keep": 0.5, "mlp_keep": 0.5, "local_steps": 2})
    method = PruneX(ctx, hierarchical=True)
    rows = run_iterations(method, ctx.recorder, 3)
    masks = {k: m.kept.clone() for k, m in method.structure.masks.items() if "#" in k}
    return {"rows": rows, "masks": masks, "z": [t.clone() for t in method.z]}


def test_prunex_sends_the_live_weights_of_the_agreed_heads_and_neurons():
    out = run_ranks(vit_worker, 4)
    for o in out[1:]:
        assert all(torch.equal(a, b) for a, b in zip(o["z"], out[0]["z"]))
    masks = out[0]["masks"]
    model = tiny_vit()
    width = WIDTH // HEADS
    live = sum(p.numel() for p in model.parameters())
    for block in range(2):
        heads = int(masks[f"blocks.{block}.attn#heads"].sum())
        neurons = int(masks[f"blocks.{block}.mlp#neurons"].sum())
        assert heads == HEADS // 2 and neurons == HIDDEN // 2
        pruned_heads, pruned_neurons = HEADS - heads, HIDDEN - neurons
        # qkv rows (and biases) and proj columns of a head; fc1 row and bias, fc2 column
        live -= pruned_heads * width * (3 * WIDTH + 3 + WIDTH)
        live -= pruned_neurons * (WIDTH + 1 + WIDTH)
    assert out[0]["rows"][-1]["packed_bytes"] == 4 * live
    assert out[0]["rows"][-1]["density"] == pytest.approx(0.5, abs=0.01)


def test_a_keep_that_prunes_nothing_is_refused_before_any_rank(tmp_path):
    proc = bench("run", "--method", "prunex", "--workload", "vit-fmnist", "--results-dir",
                 tmp_path, "--dry-run")
    line = one_line_error(proc)
    assert proc.returncode == 2
    assert "--channel-keep 0.5 prunes nothing in vit-fmnist" in line
    assert "1 input channel" in line and "--head-keep" in line and "--mlp-keep" in line
    proc = bench("run", "--method", "gmp-hier", "--head-keep", "0.5", "--dataset", "synthetic",
                 "--results-dir", tmp_path, "--dry-run")
    assert proc.returncode == 2 and "no attention heads" in one_line_error(proc)
