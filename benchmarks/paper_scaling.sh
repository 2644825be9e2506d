#!/usr/bin/env bash
# Simulated strong scaling of ResNet-152 / CIFAR-10 from 8 to 64 GPUs (paper fig. 9) for
# prunex, ddp and topk, on the paper's cluster at line rate (v100-ib100) and at the
# inter-node bandwidth the paper's own fig. 7 implies (benchmarks/profiles/v100-paper-fig7).
# One epoch each; prints seconds per epoch and speedup over 8 GPUs, and writes a report.
set -euo pipefail
out=${1:-results/paper-scaling}
for profile in v100-ib100 benchmarks/profiles/v100-paper-fig7.json; do
  name=$(basename "$profile" .json)
  bench sim --method prunex,ddp,topk --workload resnet152-cifar10 --gpus 8,16,32,64 \
    --profile "$profile" --epochs 1 --replay 6 --results-dir "$out/$name"
done
python3 - "$out" <<'PY'
import json, sys
from pathlib import Path
by = {}
for path in Path(sys.argv[1]).rglob("summary.json"):
    s = json.loads(path.read_text())
    by.setdefault((path.parts[-3], s["method"]), {})[s["gpus"]] = s["train_seconds"] / s["epochs"]
print(f"{'profile':<18} {'method':<8} " + " ".join(f"{g:>9}" for g in (8, 16, 32, 64)) + "  speedup 8->64")
for (profile, method), t in sorted(by.items()):
    cells = " ".join(f"{t[g]:8.2f}s" for g in (8, 16, 32, 64))
    print(f"{profile:<18} {method:<8} {cells}  {t[8] / t[64]:.2f}x")
PY
bench report "$out" -o "${out}-report"
