#!/usr/bin/env bash
# GPU scale-out check: SAC update throughput on CUDA for 1 and 10 seeds at replay ratio 32
# (32 updates per call), eager vs torch.compile with CUDA graphs, fp32 and bf16. Self-contained:
# needs only this repository and an environment with its dependencies installed; downloads nothing.
#   bash benchmarks/gpu_check.sh            # on a CUDA machine
#   bash benchmarks/gpu_check.sh cpu        # dry run on a CPU (same code path, small repeat count)
# Reference: a JAX SR-SAC implementation reaches ≈ 6.3 k updates/s aggregate for 10 seeds at RR 32
# on an A100; the goal on an H200 is ≥ 2× that.
set -euo pipefail
cd "$(dirname "$0")/.."
DEVICE="${1:-cuda}"
REPEATS=5
if [ "$DEVICE" = cpu ]; then REPEATS=1; fi
python - <<PY
import torch
print("torch", torch.__version__, "| device:", "$DEVICE",
      torch.cuda.get_device_name(0) if "$DEVICE".startswith("cuda") and torch.cuda.is_available() else "")
PY
for precision in fp32 bf16; do
  echo "== $precision, eager"
  python -m benchmarks.seeds_throughput --device "$DEVICE" --seeds 1 10 --updates 32 --repeats "$REPEATS" --precision "$precision"
  echo "== $precision, torch.compile (CUDA graphs on GPU)"
  python -m benchmarks.seeds_throughput --device "$DEVICE" --seeds 1 10 --updates 32 --repeats "$REPEATS" --precision "$precision" --compile
done
