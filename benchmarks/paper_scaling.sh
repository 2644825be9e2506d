#!/usr/bin/env bash
# Simulated strong scaling of ResNet-152 / CIFAR-10 from 8 to 64 GPUs (paper fig. 9) for
# prunex, ddp and topk, on the paper's cluster at line rate (v100-ib100) and at the
# inter-node bandwidth the paper's own fig. 7 implies (v100-paper-fig7); both are shipped
# profiles (suite/sim/profiles/). One epoch each; prints seconds per epoch and speedup over
# the fewest GPUs, and writes a report.
# Usage: bash benchmarks/paper_scaling.sh [RESULTS_DIR]
#        BENCH_SMOKE=1 bash benchmarks/paper_scaling.sh DIR  (prunex on cnn-fmnist at 8 and 16
#        GPUs, 2 iterations, on both profiles; no report)
set -euo pipefail
out=${1:-results/paper-scaling}
methods=prunex,ddp,topk
workload=resnet152-cifar10
gpus=8,16,32,64
budget=(--epochs 1 --replay 6)
if [[ ${BENCH_SMOKE:-0} == 1 ]]; then
  methods=prunex
  workload=cnn-fmnist
  gpus=8,16
  budget=(--iterations 2 --replay 2 --local-steps 1 --batch-size 8)
fi
for profile in v100-ib100 v100-paper-fig7; do
  bench sim --method "$methods" --workload "$workload" --gpus "$gpus" \
    --profile "$profile" "${budget[@]}" --results-dir "$out/$profile"
done
python3 - "$out" <<'PY'
import json, sys
from pathlib import Path
by = {}
for path in Path(sys.argv[1]).rglob("summary.json"):
    s = json.loads(path.read_text())
    by.setdefault((path.parts[-3], s["method"]), {})[s["gpus"]] = s["train_seconds"] / s["epochs"]
gpus = sorted({g for t in by.values() for g in t})
print(f"{'profile':<18} {'method':<8} " + " ".join(f"{g:>9}" for g in gpus)
      + f"  speedup {gpus[0]}->{gpus[-1]}")
for (profile, method), t in sorted(by.items()):
    cells = " ".join(f"{t[g]:8.2f}s" for g in gpus)
    print(f"{profile:<18} {method:<8} {cells}  {t[gpus[0]] / t[gpus[-1]]:.2f}x")
PY
if [[ ${BENCH_SMOKE:-0} != 1 ]]; then
  bench report "$out" -o "${out}-report"
fi
