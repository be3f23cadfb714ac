#!/usr/bin/env bash
# Issue 2's device run: the llama3-1b preset (Llama-3.2-1B shape, untied, 1.50B params), seq 2048,
# bf16 compute, fp32 master weights + AdamW states, fp32 gradient reduction, on every visible GPU.
# Usage (repo root, GPU machine): bash benchmarks/core_1b.sh OUT_DIR
set -uo pipefail
out=${1:-bench-out}
mkdir -p "$out"
common=(-c configs/llama3-1b-fsdp.yaml --train.steps 40 --log.every 5 --log.progress false --checkpoint.save_final false)
run() {  # name, extra args...
  local name=$1; shift
  echo "=== $name: zerofit train ${common[*]} $*"
  python3 -m zerofit.cli train "${common[@]}" --log.run_dir "$out/$name" "$@" 2>&1 | tail -n 25
}
run fsdp_eager
run fsdp_compile --parallel.compile true
run ddp_eager --parallel.backend ddp
python3 benchmarks/summarize.py "$out"/*/ | tee "$out/summary.md"
