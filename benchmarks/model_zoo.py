"""Does PruneX's structured path work on the model zoos? `bench inspect` over every torchvision
classifier and a list of timm models across its families, one process per model with a time
limit of its own, at channel keep 0.5 (the paper's) on random RGB images with realistic BN
statistics: groups, liveness, packing, and the export checked in float64. No training.

Each model ends as one of: ok (the export reproduces the masked model), refused (one line,
exit 2: a model the suite cannot prune exactly, or that cannot take the images), crash (any
other ending: a traceback, a signal), hang (past ``--limit`` seconds; the process is killed).
The table (status, dense / live / exported parameters, packed over dense bytes, seconds,
reason) goes to ``benchmarks/measured/model_zoo.md``.

    python benchmarks/model_zoo.py                       # everything (about an hour)
    python benchmarks/model_zoo.py --zoo timm --only cspresnet50,regnety_002
    python benchmarks/model_zoo.py --smoke               # two small models
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from runs import smoke_defaults

#: torchvision's two largest classifiers (over 600 M parameters): left out of a full run,
#: each would take several minutes and GBs on a CPU to build twice
TORCHVISION_SKIPPED = ("vit_h_14", "regnet_y_128gf")
#: timm models over the families: the ones the fault campaign named (CSP, Res2Net, EdgeNeXt,
#: LeViT, MLP-Mixer, EfficientFormer, RegNetY/Z, MixNet, NF-ResNet, TResNet, Swin, RexNet,
#: MobileViTv2, ECA-ResNet) and a small model of every other family
TIMM_MODELS = (
    "cspresnet50", "cspdarknet53", "cspresnext50", "res2net50_14w_8s", "res2next50",
    "edgenext_xx_small", "levit_128s", "mixer_s16_224", "efficientformer_l1",
    "efficientformerv2_s0", "regnety_002", "regnety_004", "regnetz_b16", "regnetx_002",
    "mixnet_s", "mixnet_m", "nf_resnet26", "nf_regnet_b0", "tresnet_m",
    "swin_tiny_patch4_window7_224", "rexnet_100", "mobilevitv2_050", "mobilevit_xxs",
    "ecaresnet26t", "ecaresnet50d", "resnet10t", "resnet18", "resnet50", "resnext26ts",
    "seresnext26d_32x4d", "densenet121", "dla34", "dpn68", "efficientnet_b0",
    "efficientnet_lite0", "mobilenetv2_050", "mobilenetv3_small_050", "mnasnet_050",
    "ghostnet_050", "hrnet_w18_small", "inception_v3", "xception41", "vgg11", "convnext_atto",
    "convmixer_768_32", "coat_lite_tiny", "deit_tiny_patch16_224", "vit_tiny_patch16_224",
    "pit_ti_224", "poolformer_s12", "resmlp_12_224", "gmlp_ti16_224", "botnet26t_256",
    "halonet26t", "lambda_resnet26t", "cait_xxs24_224", "twins_pcpvt_small",
    "visformer_tiny", "xcit_nano_12_p16_224", "gernet_s", "repvgg_a0", "hardcorenas_a",
    "fbnetc_100", "lcnet_050", "selecsls42b", "skresnet18", "tinynet_e", "sebotnet33ts_256",
    "cs3darknet_s", "fastvit_t8", "repghostnet_050",
)
SMOKE = (("torchvision", "resnet18"), ("timm", "mixnet_s"))


def torchvision_classifiers() -> list[str]:
    import torchvision

    return [name for name in torchvision.models.list_models(module=torchvision.models)
            if name not in TORCHVISION_SKIPPED]


def native_size(zoo: str, name: str) -> int:
    """The image size a model was made for (timm's pretrained config; torchvision's 224,
    Inception's 299): what a model that cannot take smaller images is inspected at."""
    if zoo == "timm":
        import timm

        return int(timm.get_pretrained_cfg(name).input_size[-1])
    return 299 if name == "inception_v3" else 224


def inspect_one(zoo: str, name: str, args) -> dict:
    """``bench inspect --json`` of one model in its own process, within ``args.limit``, at
    ``args.image_size``, or at the model's own size where it does not run on those images."""
    found = inspect_at(zoo, name, args, args.image_size)
    if found["status"] == "refused" and "does not run on" in (found.get("reason") or ""):
        size = native_size(zoo, name)
        if size != args.image_size:
            found = inspect_at(zoo, name, args, size)
            found["reason"] = f"at {size} px" + (f": {found['reason']}"
                                                  if found.get("reason") else "")
    return found


def inspect_at(zoo: str, name: str, args, size: int) -> dict:
    command = [sys.executable, "-m", "suite.cli", "inspect", "--model", f"{zoo}:{name}",
               "--dataset", "synthetic", "--image-size", str(size),
               "--channel-keep", "0.5", "--json"]
    started = time.perf_counter()
    try:
        proc = subprocess.run(command, capture_output=True, text=True, timeout=args.limit)
    except subprocess.TimeoutExpired:  # subprocess.run kills it
        return {"zoo": zoo, "model": name, "status": "hang",
                "reason": f"no answer within {args.limit:g} s",
                "seconds": time.perf_counter() - started}
    seconds = time.perf_counter() - started
    if proc.returncode in (0, 2):
        try:
            found = json.loads(proc.stdout)
            return {"zoo": zoo, **found, "model": name, "seconds": seconds}
        except json.JSONDecodeError:
            if proc.returncode == 2 and proc.stderr.strip().count("\n") == 0:
                return {"zoo": zoo, "model": name, "status": "refused",
                        "reason": proc.stderr.strip().removeprefix("Error: "),
                        "seconds": seconds}
    tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
    return {"zoo": zoo, "model": name, "status": "crash",
            "reason": f"exit {proc.returncode}: {tail[:200]}", "seconds": seconds}


def table(rows: list[dict]) -> str:
    """The counts per zoo and status, then the Markdown table."""
    lines = ["| zoo | model | status | dense params | live | exported | packed / dense bytes "
             "| seconds | reason |", "|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        dense = row.get("dense_parameters") or 0
        shares = ["-", "-", "-"]
        if row["status"] == "ok" and dense:
            shares = [f"{row['live_parameters'] / dense:.3f}",
                      f"{row['exported_parameters'] / dense:.3f}", f"{row['packed_share']:.3f}"]
        reason = row.get("reason") or (f"masks' blocks only: {row['untraced']}"
                                       if row.get("untraced") else "")
        reason = reason.replace("|", "/")
        lines.append(f"| {row['zoo']} | {row['model']} | {row['status']} | {dense:,} | "
                     f"{' | '.join(shares)} | {row['seconds']:.1f} | {reason} |")
    counts = []
    for zoo in sorted({r["zoo"] for r in rows}):
        mine = [r for r in rows if r["zoo"] == zoo]
        by = {s: sum(r["status"] == s for r in mine) for s in ("ok", "refused", "crash",
                                                               "hang")}
        ungrouped = sum(r["status"] == "ok" and bool(r.get("untraced")) for r in mine)
        counts.append(f"- {zoo}: {len(mine)} models: " + ", ".join(
            f"{n} {s}" for s, n in by.items()) + f" ({by['ok'] / len(mine):.0%} ok; {ungrouped} "
            "of the ok ones not grouped by Torch-Pruning: their masks' blocks are packed)")
    return "\n".join([*counts, "", *lines])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--zoo", choices=("all", "torchvision", "timm"), default="all")
    parser.add_argument("--only", default=None, help="comma list of model names")
    parser.add_argument("--limit", type=float, default=300.0, help="seconds per model")
    parser.add_argument("--image-size", type=int, default=96,
                        help="RGB images of this size (28-32 px starve ImageNet models)")
    parser.add_argument("-o", "--output", default=None,
                        help="default: benchmarks/measured/model_zoo.md (none with --smoke)")
    parser.add_argument("--smoke", action="store_true", help="two small models, 64 px")
    args = parser.parse_args()
    if args.smoke:
        smoke_defaults(args, {"image_size": 64})
        models = list(SMOKE)
    else:
        models = []
        if args.zoo in ("all", "torchvision"):
            models += [("torchvision", n) for n in torchvision_classifiers()]
        if args.zoo in ("all", "timm"):
            models += [("timm", n) for n in TIMM_MODELS]
    if args.only:
        wanted = set(args.only.split(","))
        models = [(z, n) for z, n in models if n in wanted]
    rows = []
    for zoo, name in models:
        rows.append(inspect_one(zoo, name, args))
        row = rows[-1]
        print(f"{zoo}:{name}: {row['status']} ({row['seconds']:.0f} s) {row.get('reason') or ''}",
              flush=True)
    text = table(rows)
    print(text)
    header = (f"# bench inspect over the model zoos (channel keep 0.5, RGB {args.image_size} "
              f"px, `python benchmarks/model_zoo.py`)\n\n")
    if args.output or not args.smoke:
        out = Path(args.output or Path(__file__).parent / "measured" / "model_zoo.md")
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(header + text + "\n")


if __name__ == "__main__":
    main()
