#!/usr/bin/env bash
# Issue 2's device run: the llama3-1b preset (Llama-3.2-1B shape, untied, 1.50B params), seq 2048,
# bf16 compute, fp32 master weights + AdamW states, fp32 gradient reduction, on every visible GPU.
# Usage (repo root, GPU machine): bash benchmarks/core_1b.sh OUT_DIR
set -uo pipefail
source "$(dirname "$0")/train_runs.sh" "${1:-bench-out}"
run fsdp_eager
run fsdp_compile --parallel.compile true
run ddp_eager --parallel.backend ddp
python3 benchmarks/summarize.py "$out"/*/ | tee "$out/summary.md"
