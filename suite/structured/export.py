"""``bench export``: the physically smaller model a structured-pruning run promises.

The run's evaluated model (``model.pt``: PruneX's consensus z, a pruning baseline's average)
is masked with its ``masks.pt`` and its dead slices are zeroed (:mod:`.liveness`): that is the
*masked dense model*. Every channel that is dead in its whole channel group is then
removed with Torch-Pruning's pruner functions, on the same dependency graph, so conv, BN and
linear shapes shrink together. A conv input channel that only one consumer of a residual
stream prunes cannot be removed (the stream still carries it to the others): its weights stay,
as zeros. The exported model must reproduce the masked dense model's outputs (fp32, eval
mode) within ``TOLERANCE``; otherwise nothing is written.

What is measured and written to the run folder's ``export.json``: parameters, FLOPs per image
(``torch.utils.flop_counter``), CPU inference latency at batch 1 and 128 for the dense and the
exported model, and the exported model's test accuracy.
"""

from __future__ import annotations

import copy
import math
import statistics
import time
from pathlib import Path

import torch
from torch import nn

from suite.errors import BenchError
from suite.results.folder import RunFolder, write_json, write_torch
from suite.structured.groups import ChannelGroup, example_input, trace_channel_groups
from suite.structured.liveness import LiveSlices, live_slices, zero_dead
from suite.structured.masks import StructuredMask, apply_mask, conv_shapes, load_masks
from suite.structured.packing import packed_numel

TOLERANCE = 1e-5  # max |exported - masked dense| over the checked test outputs (fp32)
CHECK_SAMPLES = 256  # test images the equality is checked on
LATENCY_BATCHES = (1, 128)


def masked_dense_model(
    model: nn.Module, masks: dict[str, StructuredMask], live: LiveSlices
) -> nn.Module:
    """A copy of ``model`` with the masks applied and every dead slice zeroed."""
    masked = copy.deepcopy(model)
    params = dict(masked.named_parameters())
    with torch.no_grad():
        for name, mask in masks.items():
            params[name].copy_(apply_mask(params[name], mask))
        zero_dead({n: p.data for n, p in params.items()}, live)
    return masked


def remove_dead_channels(
    model: nn.Module, groups: list[ChannelGroup], live: LiveSlices, example: torch.Tensor
) -> nn.Module:
    """A copy of ``model`` without the channels that are dead in their whole group.

    A group whose every channel is dead keeps one (zero) channel: a layer needs at least one.
    """
    import torch_pruning as tp

    pruned = copy.deepcopy(model).cpu().eval()
    modules = dict(pruned.named_modules())
    graph = tp.DependencyGraph().build_dependency(pruned, example_inputs=example, verbose=False)
    for group, alive in zip(groups, live.channels):
        dead = (~alive).nonzero().flatten()
        if dead.numel() == 0 or not group.producers:
            continue  # nothing to remove, or written by an unmasked op: zeros stay
        if dead.numel() == group.size:
            dead = dead[1:]
        root = group.producers[0]
        idxs = root.index[dead].tolist()
        pruning = graph.get_pruning_group(modules[root.module], tp.prune_conv_out_channels, idxs)
        pruning.prune()
    return pruned


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def flops_per_image(model: nn.Module, example: torch.Tensor) -> int:
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with counter, torch.inference_mode():
        model(example[:1])
    return int(counter.get_total_flops())


def latency_ms(
    model: nn.Module, example: torch.Tensor, batch: int, repeats: int, max_seconds: float
) -> float:
    """Median wall time of one forward pass at ``batch`` (after one warm-up), stopping after
    ``repeats`` passes or ``max_seconds``, whichever comes first (at least three passes)."""
    x = example[:1].expand(batch, *example.shape[1:]).contiguous()
    times = []
    with torch.inference_mode():
        model(x)
        start = time.perf_counter()
        while len(times) < repeats and (
            len(times) < 3 or time.perf_counter() - start < max_seconds
        ):
            t0 = time.perf_counter()
            model(x)
            times.append(time.perf_counter() - t0)
    return 1000 * statistics.median(times)


def accuracy(model: nn.Module, images: torch.Tensor, labels: torch.Tensor) -> float:
    correct = 0
    with torch.inference_mode():
        for start in range(0, len(labels), 256):
            logits = model(images[start : start + 256])
            correct += (logits.argmax(1) == labels[start : start + 256]).sum().item()
    return correct / len(labels)


def load_run_model(run_dir: Path) -> tuple[dict, nn.Module, dict[str, StructuredMask]]:
    """The run's manifest, its evaluated model and its masks; a one-line error for a folder
    that has none of them."""
    from suite.plugins.registry import WORKLOADS
    from workloads.datasets import dataset_spec

    folder = RunFolder(run_dir)
    if not folder.has_manifest:
        raise BenchError(f"{run_dir} is not a run folder (no manifest.json)")
    manifest = folder.manifest()
    config = manifest["config"]
    if not (run_dir / "masks.pt").is_file():
        raise BenchError(
            f"{run_dir}: no masks.pt: {config['method']} trains a dense model; runs of prunex, "
            "prunex-flat, gmp-hier and prune-retrain have masks to export"
        )
    if not (run_dir / "model.pt").is_file():
        raise BenchError(f"{run_dir}: no model.pt (the run did not finish): nothing to export")
    model = WORKLOADS.get(config["workload"]).factory().build_model(dataset_spec(config["dataset"]))
    try:
        state = torch.load(run_dir / "model.pt", map_location="cpu", weights_only=True)
        model.load_state_dict(state)
    except Exception as exc:  # unpickling and shape mismatches raise many kinds
        why = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
        raise BenchError(f"{run_dir}/model.pt does not fit {config['workload']} ({why})") from None
    masks = load_masks(str(run_dir), conv_shapes(model), "cpu")
    return manifest, model.eval(), masks


def export_run(
    run_dir: str | Path,
    output: str | Path | None = None,
    *,
    data_dir: str | None = None,
    repeats: int = 20,
    max_seconds: float = 10.0,
    echo=print,
) -> dict:
    """Export a run's model (see the module docstring); returns what ``export.json`` holds."""
    from workloads.datasets import load_data

    run_dir = Path(run_dir)
    manifest, model, masks = load_run_model(run_dir)
    config = manifest["config"]
    _, test, spec = load_data(
        config["dataset"],
        data_dir=data_dir or config.get("data_dir"),
        seed=config.get("seed", 0),
        synthetic_size=tuple(config.get("synthetic_size") or (4096, 1024)),
    )
    example = example_input(spec)
    groups = trace_channel_groups(model, example)
    live = live_slices(model, groups, masks)
    masked = masked_dense_model(model, masks, live)
    exported = remove_dead_channels(masked, groups, live, example)

    check = test.images[:CHECK_SAMPLES]
    with torch.inference_mode():
        diff = (exported(check) - masked(check)).abs().max().item()
    if not diff <= TOLERANCE:
        raise BenchError(
            f"{run_dir}: the exported model differs from the masked dense model by {diff:.3g} "
            f"(> {TOLERANCE}); nothing written"
        )
    live_params = sum(packed_numel(p.shape, live.of(n)) for n, p in model.named_parameters())
    sample = test.images[:1]

    def measure(net: nn.Module) -> dict:
        return {
            "parameters": count_parameters(net),
            "flops": flops_per_image(net, sample),
            **{
                f"latency_ms_b{b}": latency_ms(net, sample, b, repeats, max_seconds)
                for b in LATENCY_BATCHES
            },
        }

    threads = torch.get_num_threads()
    echo(f"measuring {config['workload']}: dense, then exported ({threads} threads)")
    dense_stats, exported_stats = measure(model), measure(exported)
    exported_stats["test_accuracy"] = accuracy(exported, test.images, test.labels)
    path = Path(output) if output is not None else run_dir / "exported.pt"
    write_torch(path, exported)
    summary = RunFolder(run_dir).summary() or {}
    record = {
        "run_id": manifest.get("run_id", run_dir.name),
        "method": config["method"],
        "workload": config["workload"],
        "dataset": config["dataset"],
        "model_file": str(path),
        "max_abs_diff": diff,
        "tolerance": TOLERANCE,
        "checked_samples": len(check),
        "test_samples": len(test.labels),
        "live_parameters": live_params,
        "run_final_accuracy": summary.get("final_accuracy"),
        "threads": torch.get_num_threads(),
        "dense": dense_stats,
        "exported": exported_stats,
        "ratios": {
            key: exported_stats[key] / dense_stats[key]
            for key in dense_stats
            if dense_stats[key] and not math.isnan(dense_stats[key])
        },
    }
    write_json(run_dir / "export.json", record)
    return record
