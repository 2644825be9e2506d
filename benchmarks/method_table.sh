#!/usr/bin/env bash
# Every method on cnn-fmnist, 4 CPU ranks as 2 nodes x 2, one data epoch (issue 4's table).
# Usage: bash benchmarks/method_table.sh [RESULTS_DIR]   (~25 minutes on 2 cores)
set -euo pipefail
out=${1:-results/method-table}
export PRUNEX_PROGRESS=0
common=(--workload cnn-fmnist --gpus 4 --gpus-per-node 2 --epochs 1 --eval-every 100000
        --results-dir "$out")
for m in ddp ddp-bf16 ddp-fp16 powersgd topk topk-hier localsgd-hier; do
  bench run --method "$m" "${common[@]}" --run-id "$m"
done
bench run --method prunex "${common[@]}" --freeze-round 8 --run-id prunex
bench run --method prunex-flat "${common[@]}" --freeze-round 8 --run-id prunex-flat
bench run --method prunex "${common[@]}" --freeze-round 8 --leader-mode sharded --run-id prunex-sharded
bench run --method prunex "${common[@]}" --freeze-round 8 --wire-dtype bf16 --run-id prunex-bf16
python - "$out" <<'PY'
import json, sys
from pathlib import Path
print("| run | accuracy | inter-node B/iteration | inter-node MB total | s/iteration |")
print("|---|---|---|---|---|")
for run in sorted(Path(sys.argv[1]).iterdir()):
    s = json.loads((run / "summary.json").read_text())
    print(f"| {run.name} | {s['final_accuracy']:.4f} | {s['inter_node_bytes_per_iteration']:.0f} "
          f"| {s['inter_node_bytes_total'] / 1e6:.1f} | {s['iteration_seconds']:.4f} |")
PY
