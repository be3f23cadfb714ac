#!/usr/bin/env bash
# Issue 29: multi-GPU on real NVLink, one phase per device call (< 10 min each; a multi-GPU call
# costs device time per GPU, so each phase is sized to run once):
#   BUNDLE=$OUT/all-results.json bash benchmarks/multi_gpu.sh PHASE OUT
# NGPU (default: every visible GPU) is the world size of the multi-GPU runs.
# Phases:
#   plan     the planner at world NGPU, held out: `zerofit plan --measure 6 --gpus NGPU` on a model
#            DDP can still hold (llama3-1b at seq 2048, fp32 masters), every engine first: per GPU
#            forecast vs measured peak memory and step time (DDP vs FSDP vs ZeRO-1/2/3 at equal
#            batch: item 2 at this size, item 4).
#   scale    scaling: the Llama-3-8B shape at seq 4096 with bf16 states (on an 80 GB card the
#            3.6B shape, which 1 GPU can hold), FSDP2 and ZeRO-3 compiled, at 1 GPU and at NGPU,
#            the same micro-batch per GPU: tokens/s per GPU and its ratio (item 1).
#   comm     communication-bound rows for the planner (item 4): ZeRO-3 with small buckets, DDP on
#            scale's model, ZeRO-3 with the optimizer on the CPU, each `zerofit plan --measure 1`
#            as configured.
#   hybrid   hybrid sharding (replicate 2 x shard NGPU/2) against full sharding at NGPU >= 4, and
#            FSDP2's explicit 2-block prefetch against its implicit one; ZeRO-3's bucket / prefetch sweep (item 3).
#   13b      13B full fine-tune without offload on NGPU GPUs (bf16 states, AC), a few steps (item 5).
#   twonode  two `zerofit train --nnodes 2` node groups on this host, NGPU/2 GPUs each, hybrid
#            sharding across the "nodes", beside one group of NGPU (item 6).
# Every group's results.json and the plan files go into OUT (and BUNDLE when set).
set -uo pipefail
phase=${1:?phase: plan | scale | comm | hybrid | 13b | twonode}
root=${2:-multi-out}
export PYTORCH_CUDA_ALLOC_CONF=${PYTORCH_CUDA_ALLOC_CONF:-expandable_segments:True}
ngpu=${NGPU:-$(nvidia-smi -L | wc -l)}
gib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)  # MiB
source "$(dirname "$0")/bench_lib.sh"
E8=configs/bench/llama3-8b-seq4096.yaml
E1=configs/bench/llama3-1b-seq2048.yaml
bf16="precision.master_dtype=bf16"
z3="parallel.backend=deepspeed parallel.deepspeed.stage=3"
# The 8B shape with bf16 states needs ~102 GiB on one GPU: on an 80 GB card scale the 3.6B shape.
mkdir -p "$root"
BIG=$root/big.yaml
shape36="overrides: {dim: 3072, n_layers: 28, n_heads: 24, n_kv_heads: 8, ffn_dim: 8192}"
if [ "${gib:-0}" -gt 100000 ]; then cp $E8 "$BIG"; else
  sed "s/^model: {\(.*\)}/model: {\1, $shape36}/" $E8 > "$BIG"
fi

plan_measure() {  # name, k strategies, timeout per strategy, config, extra plan args...
  local name=$1 k=$2 limit=$3 cfg=$4; shift 4
  mkdir -p "$root/plans"
  python3 -m zerofit.cli plan -c "$cfg" --gpus "$ngpu" --measure "$k" --measure-steps 3 \
    --measure-timeout "$limit" --measure-out "$root/plans/$name-measured.json" "$@" 2>&1 |
    grep -v "^\[20" | tail -20
}
plan_phase() {
  zf_prebuild
  plan_measure llama3-1b-fp32 6 75 $E1 --train.micro_batch_size 2 --precision.master_dtype fp32 \
    --parallel.compile false
}
scale() {  # the same micro-batch per GPU at 1 and at NGPU GPUs
  zf_prebuild
  for n in 1 "$ngpu"; do
    zf_bench "scale-$n" 200 3 5 -c "$BIG" --nproc "$n" --$bf16 --train.grad_accum_steps 1 \
      --variant "fsdp: parallel.backend=fsdp" --variant "zero3: $z3"
  done
}
comm() {
  zf_prebuild
  local c=$root/plans/comm.yaml
  mkdir -p "$root/plans"
  printf 'model: {preset: llama3-1b, seq_len: 2048}\ntrain: {micro_batch_size: 2}\n' > "$c"
  plan_measure zero3-small-buckets 1 90 "$c" --parallel.backend deepspeed \
    --parallel.deepspeed.stage 3 --parallel.deepspeed.reduce_bucket_size 5000000 \
    --parallel.deepspeed.prefetch_bucket_size 5000000
  plan_measure zero3-cpu-optim 1 120 "$c" --parallel.backend deepspeed \
    --parallel.deepspeed.stage 3 --parallel.deepspeed.offload_optimizer cpu
  plan_measure ddp-big 1 120 "$BIG" --parallel.backend ddp --$bf16 \
    --parallel.activation_checkpointing full --model.seq_len 2048
}
hybrid() {
  local half=$((ngpu / 2))
  zf_bench hybrid 150 3 5 -c "$BIG" --nproc "$ngpu" --$bf16 \
    --variant "full shard: parallel.backend=fsdp" \
    --variant "hybrid 2x$half: parallel.backend=fsdp parallel.fsdp.replicate_degree=2" \
    --variant "prefetch 2: parallel.backend=fsdp parallel.fsdp.prefetch=2"
  zf_bench zero3-sweep 150 3 5 -c "$BIG" --nproc "$ngpu" --$bf16 --parallel.backend deepspeed \
    --parallel.deepspeed.stage 3 --sweep parallel.deepspeed.prefetch_bucket_size=50000000,200000000
}
thirteen() {
  zf_bench 13b 300 2 4 --model.preset 13b --model.seq_len 2048 --nproc "$ngpu" \
    --train.micro_batch_size 2 --train.grad_accum_steps 1 --precision.mode bf16 --$bf16 \
    --data.source stdlib --data.tokenizer byte --data.max_tokens 1000000 --train.eval_every 0 \
    --checkpoint.save_final false --parallel.activation_checkpointing full \
    --parallel.compile true --variant "fsdp: parallel.backend=fsdp" --variant "zero3: $z3"
}
twonode() {  # one group of NGPU against two node groups of NGPU/2, the same seed and mesh
  local half=$((ngpu / 2)) port=29517 c=$root/twonode.yaml
  mkdir -p "$root/one" "$root/two"
  printf 'model: {preset: llama3-1b, seq_len: 2048}\ntrain: {steps: 20, micro_batch_size: 2}\n%s\n' \
    "parallel: {backend: fsdp, compile: true, fsdp: {replicate_degree: 2}}" > "$c"
  python3 -m zerofit.cli train -c "$c" --nproc "$ngpu" --log.run_dir "$root/one/run" \
    > "$root/one/log.txt" 2>&1
  for r in 0 1; do
    python3 -m zerofit.cli train -c "$c" --nproc "$half" --nnodes 2 --node-rank $r \
      --rdzv-endpoint 127.0.0.1:$port --log.run_dir "$root/two/run" > "$root/two/log$r.txt" 2>&1 &
  done
  wait
  python3 benchmarks/summarize.py "$root/one/run" "$root/two/run" 2>&1 | tail -30
}
mkdir -p "$root"
case $phase in
plan) plan_phase ;;
scale) scale ;;
comm) comm ;;
hybrid) hybrid ;;
13b) thirteen ;;
twonode) twonode ;;
*) echo "unknown phase $phase"; exit 2 ;;
esac
if [ -n "${BUNDLE:-}" ]; then python3 benchmarks/bundle_results.py "$root" "$BUNDLE"; fi
