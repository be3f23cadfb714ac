#!/usr/bin/env bash
# Issue 3's device run: FSDP2 and DeepSpeed ZeRO side by side on the llama3-1b preset, seq 2048, mbs 4,
# bf16 compute, fp32 master weights + AdamW states, fp32 gradient reduction, every visible GPU.
# Usage (repo root, GPU machine, DeepSpeed importable): bash benchmarks/engines_1b.sh OUT_DIR
set -uo pipefail
RUN_TIMEOUT=240 RUN_TAIL=20
source "$(dirname "$0")/train_runs.sh" "${1:-bench-out}"
run fsdp_eager
run zero3_fusedadam --parallel.backend deepspeed --parallel.deepspeed.stage 3
run zero3_torchadam --parallel.backend deepspeed --parallel.deepspeed.stage 3 --parallel.deepspeed.torch_adam true
run zero2_fusedadam --parallel.backend deepspeed --parallel.deepspeed.stage 2
run fsdp_compile --parallel.compile true
run zero3_compile --parallel.backend deepspeed --parallel.deepspeed.stage 3 --parallel.compile true
python3 benchmarks/summarize.py "$out"/*/ | tee "$out/summary.md"
for d in "$out"/*/; do [ -f "$d/precision.json" ] && echo "$(basename "$d"): $(tr -d '\n ' < "$d/precision.json")"; done
