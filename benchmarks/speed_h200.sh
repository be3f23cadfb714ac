#!/usr/bin/env bash
# Issue 5's speed figures on one H200, with `zerofit bench` (each variant in its own processes,
# median step time after warm-up). Phases so that each fits in one 10-minute device call:
#   bash benchmarks/speed_h200.sh 8b  OUT      # Llama-3-8B shape, seq 4096: FSDP vs ZeRO-3, bf16 and fp32 states
#   bash benchmarks/speed_h200.sh 1b  OUT      # llama3-1b, seq 2048, fp32 master + states: FSDP vs ZeRO-3
#   bash benchmarks/speed_h200.sh 13b OUT      # 13B on one GPU with ZeRO-3 + (partial) optimizer offload
# Needs zerofit and DeepSpeed importable (see docs/benchmarks/ for the device prelude).
set -uo pipefail
phase=${1:?phase: 8b | 1b | 13b}
out=${2:-bench-out}/$phase
steps=${STEPS:-10}
warmup=${WARMUP:-2}
bench() { python3 -m zerofit.cli bench --warmup "$warmup" --steps "$steps" --out "$out" "$@" 2>&1 | grep -v "^\[20"; }
bf16="precision.master_dtype=bf16"
fp32="precision.master_dtype=fp32"
z3="parallel.backend=deepspeed parallel.deepspeed.stage=3"
attn="model.attention=${ATTN:-auto}"  # ATTN=cudnn picks cuDNN's fused attention
export PYTORCH_CUDA_ALLOC_CONF=${PYTORCH_CUDA_ALLOC_CONF:-expandable_segments:True}
case $phase in
8b)
  pure="$bf16 precision.reduce_dtype=bf16"  # bf16 weights, grads, states (one GPU: reduction is a copy)
  bench -c configs/bench/llama3-8b-seq4096.yaml --timeout 150 \
    --variant "fsdp bf16-states mbs2 ga2: parallel.backend=fsdp $pure train.micro_batch_size=2 train.grad_accum_steps=2 $attn" \
    --variant "zero3 bf16-states mbs2 ga2: $z3 $pure train.micro_batch_size=2 train.grad_accum_steps=2 $attn" \
    --variant "fsdp fp32-states AC mbs2 ga2: parallel.backend=fsdp $fp32 parallel.activation_checkpointing=full train.micro_batch_size=2 train.grad_accum_steps=2 $attn" \
    --variant "zero3 fp32-states AC mbs2 ga2: $z3 $fp32 parallel.activation_checkpointing=full train.micro_batch_size=2 train.grad_accum_steps=2 $attn"
  ;;
1b)
  bench -c configs/bench/llama3-1b-seq2048.yaml --timeout 75 \
    --variant "fsdp mbs8: parallel.backend=fsdp" \
    --variant "fsdp mbs8 cudnn-attn: parallel.backend=fsdp model.attention=cudnn" \
    --variant "zero3 mbs8: $z3 $attn"
  ;;
13b)
  # fp32 master + AdamW states would be 16 B/param = 208 GB for 13B: more than GPU + host RAM hold
  # next to the bf16 weights. So: bf16 master weights, gradients and AdamW states (8 B/param), the
  # optimizer (and its states) on the CPU.
  warmup=1; steps=${STEPS_13B:-5}
  bench --timeout 330 --model.preset 13b --model.seq_len 2048 --train.micro_batch_size 4 \
    --train.grad_accum_steps 2 --precision.mode bf16 --$bf16 --data.max_tokens 1000000 \
    --parallel.activation_checkpointing full --optim.warmup_steps 2 \
    --variant "zero3 optim->cpu bf16-states: $z3 parallel.deepspeed.offload_optimizer=cpu"
  ;;
*) echo "unknown phase $phase"; exit 2 ;;
esac
