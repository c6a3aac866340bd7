#!/usr/bin/env bash
# GPU scale-out check: SAC update throughput on CUDA for 1 and 10 seeds at replay ratio 32
# (32 updates per call), eager vs torch.compile with CUDA graphs, fp32 and bf16.
#   bash benchmarks/gpu_check.sh            # on a CUDA machine
#   bash benchmarks/gpu_check.sh cpu        # dry run on a CPU (same code path, small repeat count)
# From a bare machine: when the active python cannot import torch and this package, it first
# creates .venv-gpu-check and installs torch==2.13.0 (PyPI's Linux x86-64 wheel is the CUDA
# build) and this repository into it; otherwise it installs nothing. Prints the elapsed time.
# Reference: a JAX SR-SAC implementation reaches ≈ 6.3 k updates/s aggregate for 10 seeds at RR 32
# on an A100; the goal on an H200 is ≥ 2× that (≥ 12.6 k).
set -euo pipefail
cd "$(dirname "$0")/.."
START=$SECONDS
DEVICE="${1:-cuda}"
if [[ ! "$DEVICE" =~ ^(cpu|cuda(:[0-9]+)?)$ ]]; then
  echo "gpu_check: device '$DEVICE' is not one of cpu, cuda, cuda:<i>" >&2
  exit 2
fi
REPEATS=5
if [ "$DEVICE" = cpu ]; then REPEATS=1; fi
if ! python -c "import benchmarks.common" 2>/dev/null; then
  echo "== installing torch==2.13.0 and this repository into .venv-gpu-check"
  python3 -m venv .venv-gpu-check
  # shellcheck disable=SC1091
  source .venv-gpu-check/bin/activate
  python -m pip install --quiet --upgrade pip
  python -m pip install --quiet torch==2.13.0
  python -m pip install --quiet -e .
  echo "   installed in $((SECONDS - START)) s"
fi
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
echo "== reference: JAX SR-SAC ≈ 6.3 k aggregate updates/s for 10 seeds at RR 32 on an A100 (goal ≥ 12.6 k)"
echo "== gpu_check took $((SECONDS - START)) s"
