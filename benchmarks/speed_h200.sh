#!/usr/bin/env bash
# Issue 5's speed figures on one H200 with `zerofit bench` (each variant in its own processes,
# median step time after warm-up), in one device call of at most ~10 minutes:
#   bash benchmarks/speed_h200.sh all OUT     # everything below, most important first, under DEADLINE s
#   bash benchmarks/speed_h200.sh pair OUT    # FSDP vs ZeRO-3 on both models only
#   bash benchmarks/speed_h200.sh 8b OUT      # Llama-3-8B shape, seq 4096: FSDP and ZeRO-3
#   bash benchmarks/speed_h200.sh 1b OUT      # llama3-1b, seq 2048, fp32 master + states: FSDP and ZeRO-3
#   bash benchmarks/speed_h200.sh 13b OUT     # 13B on one GPU, ZeRO-3 with half the optimizer on the CPU
# Needs zerofit and DeepSpeed importable (the device prelude is in docs/benchmarks/).
set -uo pipefail
phase=${1:?phase: all | 8b | 1b | 13b}
root=${2:-bench-out}
deadline=${DEADLINE:-570}  # seconds, for `all`: each group's timeout is cut to what is left
export PYTORCH_CUDA_ALLOC_CONF=${PYTORCH_CUDA_ALLOC_CONF:-expandable_segments:True}
bf16="precision.master_dtype=bf16"
pure="$bf16 precision.reduce_dtype=bf16"  # bf16 weights, grads, AdamW states (1 GPU: reduce is a copy)
fp32="precision.master_dtype=fp32"
z3="parallel.backend=deepspeed parallel.deepspeed.stage=3"
mb2="train.micro_batch_size=2 train.grad_accum_steps=2"

source "$(dirname "$0")/bench_lib.sh"
left() { echo $((deadline - SECONDS)); }
bench() {  # out-subdir, per-variant timeout, warmup, steps, args...
  local sub=$1 limit=$2 warmup=$3 steps=$4; shift 4
  if [ "$phase" = all ] && [ "$(left)" -lt "$limit" ]; then limit=$(left); fi
  if [ "$limit" -lt 30 ]; then echo "skipped $sub: out of time"; return; fi
  zf_bench "$sub" "$limit" "$warmup" "$steps" "$@"
}
prebuild() { zf_prebuild; }
eight_b() {
  bench 8b 110 2 10 -c configs/bench/llama3-8b-seq4096.yaml \
    --variant "fsdp bf16-states mbs2 ga2: parallel.backend=fsdp $pure $mb2" \
    --variant "zero3 bf16-states mbs2 ga2: $z3 $pure $mb2"
}
fp32_8b() {
  bench 8b-fp32 110 2 10 -c configs/bench/llama3-8b-seq4096.yaml \
    --variant "fsdp fp32-states AC mbs2 ga2: parallel.backend=fsdp $fp32 parallel.activation_checkpointing=full $mb2"
}
one_b() {
  bench 1b 80 2 10 -c configs/bench/llama3-1b-seq2048.yaml \
    --variant "fsdp mbs8 ga2: parallel.backend=fsdp train.grad_accum_steps=2" \
    --variant "zero3 mbs8 ga2: $z3 train.grad_accum_steps=2"
}
thirteen_b() {
  # fp32 master + AdamW states would be 16 B/param = 208 GB for 13B, more than GPU and host RAM
  # hold; so bf16 master weights, gradients and AdamW states (8 B/param), half of them (and their
  # Adam update) on the CPU, half on the GPU (DeepSpeed's offload ratio).
  bench 13b 220 1 3 --model.preset 13b --model.seq_len 2048 --train.micro_batch_size 4 \
    --train.grad_accum_steps 2 --precision.mode bf16 --$bf16 --data.max_tokens 1000000 \
    --parallel.activation_checkpointing full --optim.lr 1e-4 --optim.warmup_steps 2 \
    --variant "zero3 optim 50% cpu bf16-states: $z3 parallel.deepspeed.offload_optimizer=cpu parallel.deepspeed.offload_ratio=0.5"
}
mkdir -p "$root"
case $phase in
all) prebuild & eight_b; wait; one_b; thirteen_b; fp32_8b ;;
pair) prebuild & one_b; wait; eight_b ;;  # FSDP vs ZeRO-3 on both models
8b) prebuild; eight_b; fp32_8b ;;
1b) prebuild; one_b ;;
13b) prebuild; thirteen_b ;;
*) echo "unknown phase $phase"; exit 2 ;;
esac
for log in "$root"/*/logs/*.log; do
  grep -qE "^(error|Traceback)|Error" "$log" && { echo "== $log"; grep -v "^\[20" "$log" | grep -E "Error|error|Killed|memory" | tail -4 | cut -c1-400; }
done
free -g | head -2
