#!/usr/bin/env bash
# Issue 28 probe, one device call: the 8B DPO LoRA run traced under FSDP + full AC and DDP + full AC
# (benchmarks/ac_trace.py: block calls, allocated memory at each block's start and end, gathered
# FSDP blocks), then benchmarks/fsdp_lora_mem.py's ways. Needs the DPO device prelude (.dpo).
#   bash benchmarks/fsdp_ac_probe.sh FIXTURE OUT
set -uo pipefail
fix=${1:?fixture folder (.dpo/fix)}
out=${2:?out folder}
export PYTORCH_CUDA_ALLOC_CONF=${PYTORCH_CUDA_ALLOC_CONF:-expandable_segments:True}
args=(train -c configs/dpo-lora.yaml --model.hf "$fix/model-8b" --data.source "$fix/pairs.jsonl"
  --model.seq_len 2048 --model.random_init true --train.steps 3 --train.epochs null
  --train.micro_batch_size 2 --train.grad_accum_steps 4 --parallel.activation_checkpointing full
  --checkpoint.every 0 --checkpoint.save_final false --checkpoint.export_final false
  --train.eval_every 0 --data.val_fraction 0 --log.every 1)
for backend in auto ddp; do
  mkdir -p "$out/$backend"
  timeout 200 torchrun --standalone --nproc-per-node 1 benchmarks/ac_trace.py "$out/$backend" \
    "${args[@]}" --parallel.backend "$backend" --log.run_dir "$out/$backend/run" \
    > "$out/$backend/log.txt" 2>&1
  echo "== $backend rc $?"; grep -E "parallel.backend|^model|^precision|^step|rror|memory" "$out/$backend/log.txt" | tail -9 | cut -c1-300
done
OUT=$out timeout 150 python3 benchmarks/fsdp_lora_mem.py plain-ac-compile fsdp-ac-compile fsdp-ac fsdp 2>&1 | grep -v Warning | tail -6
