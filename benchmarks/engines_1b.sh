#!/usr/bin/env bash
# Issue 3's device run: FSDP2 and DeepSpeed ZeRO side by side on the llama3-1b preset, seq 2048, mbs 4,
# bf16 compute, fp32 master weights + AdamW states, fp32 gradient reduction, every visible GPU.
# Usage (repo root, GPU machine, DeepSpeed importable): bash benchmarks/engines_1b.sh OUT_DIR
set -uo pipefail
out=${1:-bench-out}
mkdir -p "$out"
common=(-c configs/llama3-1b-fsdp.yaml --train.steps 40 --log.every 5 --log.progress false --checkpoint.save_final false)
run() {  # name, extra args...
  local name=$1; shift
  echo "=== $name: zerofit train ${common[*]} $*"
  timeout 240 python3 -m zerofit.cli train "${common[@]}" --log.run_dir "$out/$name" "$@" 2>&1 | grep -v "^\[20" | tail -n 20
}
run fsdp_eager
run zero3_fusedadam --parallel.backend deepspeed --parallel.deepspeed.stage 3
run zero3_torchadam --parallel.backend deepspeed --parallel.deepspeed.stage 3 --parallel.deepspeed.torch_adam true
run zero2_fusedadam --parallel.backend deepspeed --parallel.deepspeed.stage 2
run fsdp_compile --parallel.compile true
run zero3_compile --parallel.backend deepspeed --parallel.deepspeed.stage 3 --parallel.compile true
python3 benchmarks/summarize.py "$out"/*/ | tee "$out/summary.md"
for d in "$out"/*/; do [ -f "$d/precision.json" ] && echo "$(basename "$d"): $(tr -d '\n ' < "$d/precision.json")"; done
