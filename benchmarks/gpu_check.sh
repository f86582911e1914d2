#!/usr/bin/env bash
# The prepared GPU check (issue: performance): bert-large at length 512 and bert-base at 128, bf16, on one NVIDIA GPU.
# Runs in under 5 minutes on an H100/H200; prints tokens/s and MFU against the bf16 dense peak (989 TFLOP/s there)
# and appends the JSON lines to benchmarks/gpu_results.jsonl. Usage: bash benchmarks/gpu_check.sh [PEAK_FLOPS]
set -euo pipefail
cd "$(dirname "$0")/.."
PEAK=${1:-989e12}
python3 -m venv .venv-gpu
.venv-gpu/bin/pip install -q -e '.[gpu]'
export XLA_PYTHON_CLIENT_MEM_FRACTION=0.9 TF_CPP_MIN_LOG_LEVEL=2
run() { .venv-gpu/bin/python benchmarks/train_step.py --baseline=none --peak_flops="$PEAK" --rounds=3 --steps=10 "$@" \
          | tee /dev/stderr | tail -1 >> benchmarks/gpu_results.jsonl; }
run --model=bert-base --batch=256 --seq=128 --set dtype=bfloat16 --set scan_layers=true
run --model=bert-large --batch=64 --seq=512 --set dtype=bfloat16 --set scan_layers=true --set remat_policy=dots
