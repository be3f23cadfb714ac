#!/usr/bin/env bash
# Issue 14 (speed round 2) on one H200 with `zerofit bench`, one phase per device call (<10 min):
#   bash benchmarks/speed2_h200.sh PHASE OUT
# Phases:
#   c1    13B at lr 1e-4 for 25 steps (bf16 weights + AdamW states, no offload, full AC);
#         8B fp32-master levers (micro-batch 4 with full AC; every-2nd-block AC at micro-batch 1);
#         llama3-1b fp32-master: the chunked fused head vs full logits.
#   c2    a 24 GB card rehearsed (train.gpu_memory_limit): `zerofit plan --gpu-mem 24GB --write`
#         for 1.5B and 3.6B at a fixed global batch of 64 x 2048, then `zerofit bench` on what it
#         wrote; FP8 (torchao tensorwise / rowwise) against bf16 on the 8B shape; llama3-1b, the
#         built-in model against transformers' Llama of the same shape, profiled (--profile).
#   c4    FP8 on the 8B shape, then the built-in model against transformers' Llama (c2's last two).
#   c5    FP8 against bf16 at 1B for 300 steps (run on its own after c2 ran out of time).
#   c3    the planner held out: `zerofit plan --measure 8` on 2 configurations no constant was fitted on
#         (llama3-1b at seq 1024 bf16 master; a 3.6B shape at seq 1024 fp32 master); c8: 2 more
#         (llama3-1b at seq 2048 fp32 master; 3.6B at seq 2048 bf16 master).
#   c6    c2's 24 GB rehearsal again (after the planner's offload fixes); ZeRO-3 against FSDP2 at 8B
#         (with DeepSpeed's prefetch window raised); the GPU tests.
#   c7    the GPU-only tests of this round (FP8, the fused head).
#   c9    FSDP2 cpu_offload at 24 GB (1.5B, 16 x 4, AC, compile): fused CPU AdamW against foreach.
#   c10   c6's 24 GB rehearsal on the eager ZeRO-3 + AC plans, each beside the same plan compiled
#         (ZeRO-3 + AC + compile, now without CUDA allocation-history recording).
#         (Its 3.6B compiled run was cut by the call's limit and re-run alone: `c10b`.)
#   c11   c9, then held-out config a again with a 3-step warm-up; c12: held-out c and b again.
#   c13   the 24 GB levers on 1.5B, each AC + compile: FSDP2 offload with fused / foreach CPU
#         AdamW at 16 x 4; ZeRO-3 with the whole optimizer on the CPU at 8 x 8, parameters too or not.
#   c14   held-out config a again with a 3-step warm-up (c3 with HELDOUT="a:8:280", runs <= 70 s).
#   c15   where ZeRO-3 offload's step goes: `zerofit bench --profile` of the 3.6B 24 GB plan,
#         compiled (its forecast is 25% slow), with 3 warm-up steps.
#   c16   fp32 masters at 8B, micro-batch 4: full AC against `first_k` (the first 12/14/16/20 of 32
#         blocks recompute; the later ones keep their activations, freed first in backward).
#   c17   why c16's first_k was slower: full AC and first_k profiled at micro-batch 4 (near the
#         card's limit) and 2 (far from it), with the allocator's retries counted.
#   c18   the planner's 1.5B 24 GB plan now that it proposes first_k: as written, and with full AC.
#   c19   fp32 masters at 8B, full AC, micro-batch 4, with 4 and 8 micro-batches per optimizer step.
# Every group's results.json, every run's metrics.jsonl and summary step losses, the plan outputs
# and the profile tables go into OUT/all-results.json.
set -uo pipefail
phase=${1:?phase}
root=${2:-bench-out}
export PYTORCH_CUDA_ALLOC_CONF=${PYTORCH_CUDA_ALLOC_CONF:-expandable_segments:True}
bf16="precision.master_dtype=bf16"
fp32="precision.master_dtype=fp32"
z3="parallel.backend=deepspeed parallel.deepspeed.stage=3"
E8=configs/bench/llama3-8b-seq4096.yaml
E1=configs/bench/llama3-1b-seq2048.yaml

source "$(dirname "$0")/bench_lib.sh"
bench() { zf_bench "$@"; }
prebuild() { zf_prebuild; }
thirteen_b() {  # 13B: bf16 weights, gradients and AdamW states (8 B/param, 97 GiB), no offload
  bench 13b 200 3 22 --model.preset 13b --model.seq_len 2048 --train.micro_batch_size 4 \
    --train.grad_accum_steps 2 --precision.mode bf16 --$bf16 --data.max_tokens 1000000 \
    --data.source stdlib --data.tokenizer byte --train.eval_every 0 --checkpoint.save_final false \
    --parallel.activation_checkpointing full --parallel.compile true --optim.lr 1e-4 \
    --optim.warmup_steps 2 --log.every 1 --model.loss_chunk 4096 \
    --variant "ddp AC compile bf16-states: parallel.backend=ddp"
}
fp32_8b() {
  bench 8b-fp32 150 2 6 -c $E8 \
    --variant "fsdp fp32-states AC mbs4 ga1: parallel.backend=fsdp $fp32 parallel.activation_checkpointing=full train.micro_batch_size=4 train.grad_accum_steps=1" \
    --variant "fsdp fp32-states AC every-2 mbs1 ga4: parallel.backend=fsdp $fp32 parallel.activation_checkpointing=every_k parallel.ac_every=2"
}
head_1b() {
  bench 1b-head 90 2 8 -c $E1 \
    --variant "fsdp chunked head mbs8: parallel.backend=fsdp" \
    --variant "fsdp full logits mbs8: parallel.backend=fsdp model.loss_chunk=0"
}

pure="$bf16 precision.reduce_dtype=bf16"
mb2="train.micro_batch_size=2 train.grad_accum_steps=2"
common="data: {source: stdlib, tokenizer: byte, max_tokens: 3000000}
train: {global_batch_size: 64, eval_every: 0}
optim: {lr: 3.0e-4, warmup_steps: 2}
precision: {mode: bf16, master_dtype: fp32}
checkpoint: {save_final: false}"
plan24() {  # plan24 SIZE: `zerofit plan --write` for a 24 GB card at 64 x 2048 tokens per step
  local m=$1
  mkdir -p "$root/plans"
  printf 'model: {preset: llama3-1b, seq_len: 2048}\n%s\nparallel: {compile: true}\n' "$common" > "$root/plans/1.5b.yaml"
  printf 'model: {preset: llama3-1b, seq_len: 2048, overrides: {dim: 3072, n_layers: 28, n_heads: 24, n_kv_heads: 8, ffn_dim: 8192}}\n%s\nparallel: {compile: true}\n' "$common" > "$root/plans/3.6b.yaml"
  python3 -m zerofit.cli plan -c "$root/plans/$m.yaml" --gpus 1 --gpu-mem 24GB --json > "$root/plans/$m-plan.json" 2> "$root/plans/$m-plan.err"
  python3 -m zerofit.cli plan -c "$root/plans/$m.yaml" --gpus 1 --gpu-mem 24GB --write "$root/plans/$m-24gb.yaml" 2>&1 | tail -4
}
offload24() {  # plan for a 24 GB card, then train what it wrote (OFFLOAD24_COMPILE: also compiled)
  for m in 1.5b 3.6b; do
    plan24 $m
    cat "$root/plans/$m-24gb.yaml"
    bench "24gb-$m" 240 1 3 -c "$root/plans/$m-24gb.yaml" --variant "planned for 24GB: train.gpu_memory_limit=24GB" \
      ${OFFLOAD24_COMPILE:+--variant "planned for 24GB + compile: train.gpu_memory_limit=24GB parallel.compile=true"}
  done
}
fp8_8b() {
  bench 8b-fp8 150 2 6 -c $E8 \
    --variant "fsdp bf16 mbs2 ga2: parallel.backend=fsdp $pure $mb2" \
    --variant "fsdp fp8 tensorwise mbs2 ga2: parallel.backend=fsdp $pure $mb2 precision.fp8=tensorwise" \
    --variant "fsdp fp8 rowwise mbs2 ga2: parallel.backend=fsdp $pure $mb2 precision.fp8=rowwise"
}
builtin_vs_hf() {  # the same config; model.hf: a LlamaForCausalLM folder of llama3-1b's shape
  python3 benchmarks/hf_shape.py llama3-1b "$root/hf-llama3-1b" >/dev/null
  sed "s#preset: llama3-1b#hf: $root/hf-llama3-1b, random_init: true#" $E1 > "$root/hf-1b.yaml"
  bench 1b-builtin 90 2 6 -c $E1 --profile --variant "built-in mbs8: parallel.backend=fsdp"
  bench 1b-hf 120 2 6 -c "$root/hf-1b.yaml" --profile --variant "transformers Llama mbs8: parallel.backend=fsdp"
}
heldout() {  # HELDOUT="a:K:LIMIT_S ...": configs no planner constant was fitted on, K strategies each
  mkdir -p "$root/heldout"
  local d="data: {max_tokens: 1000000}" big="overrides: {dim: 3072, n_layers: 28, n_heads: 24, n_kv_heads: 8, ffn_dim: 8192}"
  printf 'model: {preset: llama3-1b, seq_len: 1024}\ntrain: {micro_batch_size: 4}\nprecision: {mode: bf16, master_dtype: bf16}\n%s\n' "$d" > "$root/heldout/a.yaml"
  printf 'model: {preset: llama3-1b, seq_len: 2048}\ntrain: {micro_batch_size: 2}\nprecision: {mode: bf16, master_dtype: fp32}\n%s\n' "$d" > "$root/heldout/b.yaml"
  printf 'model: {preset: llama3-1b, seq_len: 1024, %s}\ntrain: {micro_batch_size: 2}\nprecision: {mode: bf16, master_dtype: fp32}\n%s\n' "$big" "$d" > "$root/heldout/c.yaml"
  printf 'model: {preset: llama3-1b, seq_len: 2048, %s}\ntrain: {micro_batch_size: 1}\nprecision: {mode: bf16, master_dtype: bf16}\n%s\n' "$big" "$d" > "$root/heldout/d.yaml"
  for spec in ${HELDOUT:-a:8:240 c:8:300}; do
    IFS=: read -r c k limit <<< "$spec"
    echo "== held-out config $c: $k strategies, at most ${limit}s"
    timeout "$limit" python3 -m zerofit.cli plan -c "$root/heldout/$c.yaml" --gpus 1 --measure "$k" \
      --measure-steps 2 --measure-timeout "${HELDOUT_RUN_S:-120}" --measure-out "$root/heldout/$c-measured.json" 2>&1 | grep -v "^[┏┡└│┃]" | tail -12
    pkill -f "zerofit.cli train" 2>/dev/null; sleep 2  # a run cut short by the limit
  done
}
fp8_loss_1b() {  # 300 steps on the same data: bf16 against FP8
  bench 1b-fp8-loss 110 2 298 -c $E1 --train.micro_batch_size 4 --optim.warmup_steps 30 \
    --variant "bf16: parallel.backend=fsdp" \
    --variant "fp8 tensorwise: parallel.backend=fsdp precision.fp8=tensorwise"
}
zero3_8b() {  # ZeRO-3 against FSDP2 at 8B, bf16 weights/states, and a larger prefetch window
  bench 8b-zero3 150 2 5 -c $E8 \
    --variant "fsdp bf16 mbs2 ga2: parallel.backend=fsdp $pure $mb2" \
    --variant "zero3 bf16 mbs2 ga2: $z3 $pure $mb2" \
    --variant "zero3 bf16 mbs2 ga2 prefetch 2e8: $z3 $pure $mb2 parallel.deepspeed.prefetch_bucket_size=200000000 parallel.deepspeed.max_live_parameters=2000000000"
}
fsdp_offload24() {  # FSDP2 cpu_offload for a 24 GB card: fused CPU AdamW (the default) against foreach
  local cap="train.gpu_memory_limit=24GB parallel.backend=fsdp parallel.fsdp.cpu_offload=true parallel.activation_checkpointing=full parallel.compile=true train.micro_batch_size=16 train.grad_accum_steps=4"
  printf 'model: {preset: llama3-1b, seq_len: 2048}\n%s\n' "$common" > "$root/fsdp-offload-1.5b.yaml"
  bench 24gb-fsdp-offload 240 1 3 -c "$root/fsdp-offload-1.5b.yaml" \
    --variant "fsdp offload fused adamw 16x4: $cap" \
    --variant "fsdp offload foreach adamw 16x4: $cap optim.fused=false"
}
levers24() {  # what a 24 GB card can use for 1.5B at 64 x 2048, each with AC and compile
  local cap="train.gpu_memory_limit=24GB parallel.activation_checkpointing=full parallel.compile=true"
  local fo="$cap parallel.backend=fsdp parallel.fsdp.cpu_offload=true train.micro_batch_size=16 train.grad_accum_steps=4"
  local z="$cap $z3 parallel.deepspeed.offload_optimizer=cpu parallel.deepspeed.offload_ratio=1.0 parallel.deepspeed.sub_group_size=1000000000 train.micro_batch_size=8 train.grad_accum_steps=8"
  printf 'model: {preset: llama3-1b, seq_len: 2048}\n%s\n' "$common" > "$root/1.5b.yaml"
  bench 24gb-1.5b-levers 200 3 3 -c "$root/1.5b.yaml" \
    --variant "fsdp offload fused adamw 16x4: $fo" \
    --variant "zero3 optim+params cpu 8x8 compile: $z parallel.deepspeed.offload_param=cpu" \
    --variant "zero3 optim cpu 8x8 compile: $z" \
    --variant "fsdp offload foreach adamw 16x4: $fo optim.fused=false"
}
compiled36() {  # c10's 3.6B plan, compiled (after c10 wrote plans/3.6b-24gb.yaml)
  [ -f "$root/plans/3.6b-24gb.yaml" ] || plan24 3.6b
  bench 24gb-3.6b-compile 240 1 3 -c "$root/plans/3.6b-24gb.yaml" \
    --variant "planned for 24GB + compile: train.gpu_memory_limit=24GB parallel.compile=true"
}
profile36() {  # the 3.6B 24 GB plan compiled, profiled (compute / optimizer / host / idle)
  [ -f "$root/plans/3.6b-24gb.yaml" ] || plan24 3.6b
  bench 24gb-3.6b-profile 300 3 2 -c "$root/plans/3.6b-24gb.yaml" --profile \
    --variant "c10b's run, 8 x 8: train.gpu_memory_limit=24GB parallel.compile=true train.micro_batch_size=8 train.grad_accum_steps=8"
}
fp32_8b_first_k() {  # fp32 masters at 8B, micro-batch 4: full AC against recomputing the first k blocks only
  local f="parallel.backend=fsdp $fp32 train.micro_batch_size=4 train.grad_accum_steps=1"
  bench 8b-fp32-first-k 150 2 6 -c $E8 \
    --variant "fsdp fp32-states AC mbs4: $f parallel.activation_checkpointing=full" \
    --variant "fsdp fp32-states AC first 16 mbs4: $f parallel.activation_checkpointing=first_k parallel.ac_blocks=16" \
    --variant "fsdp fp32-states AC first 20 mbs4: $f parallel.activation_checkpointing=first_k parallel.ac_blocks=20" \
    --variant "fsdp fp32-states AC first 14 mbs4: $f parallel.activation_checkpointing=first_k parallel.ac_blocks=14" \
    --variant "fsdp fp32-states AC first 12 mbs4: $f parallel.activation_checkpointing=first_k parallel.ac_blocks=12"
}
first_k_why() {  # c16 found first_k slower than full AC at mbs 4 (near the card's limit): profiled, and
  # again at mbs 2 (far from it), with the allocator's retries counted
  local f="parallel.backend=fsdp $fp32 train.grad_accum_steps=1"
  bench 8b-fp32-first-k-why 150 2 5 -c $E8 --profile 1 \
    --variant "fsdp fp32-states AC mbs4: $f train.micro_batch_size=4 parallel.activation_checkpointing=full" \
    --variant "fsdp fp32-states AC first 20 mbs4: $f train.micro_batch_size=4 parallel.activation_checkpointing=first_k parallel.ac_blocks=20" \
    --variant "fsdp fp32-states AC mbs2: $f train.micro_batch_size=2 parallel.activation_checkpointing=full" \
    --variant "fsdp fp32-states AC first 16 mbs2: $f train.micro_batch_size=2 parallel.activation_checkpointing=first_k parallel.ac_blocks=16"
}
fp32_8b_accum() {  # c17's fastest (full AC, micro-batch 4) with 4 and 8 micro-batches per optimizer step:
  # its 107 ms AdamW step over fp32 states is paid once per step, 6% of a one-micro-batch step
  local f="parallel.backend=fsdp $fp32 train.micro_batch_size=4 parallel.activation_checkpointing=full"
  bench 8b-fp32-accum 110 2 3 -c $E8 \
    --variant "fsdp fp32-states AC mbs4 ga4: $f train.grad_accum_steps=4" \
    --variant "fsdp fp32-states AC mbs4 ga8: $f train.grad_accum_steps=8"
}
first_k24() {  # the planner now proposes first_k: its 1.5B 24 GB plan as written, and with full AC
  plan24 1.5b
  cat "$root/plans/1.5b-24gb.yaml" | grep -A3 "activation_checkpointing"
  bench 24gb-1.5b-first-k 240 2 3 -c "$root/plans/1.5b-24gb.yaml" \
    --variant "planned for 24GB: train.gpu_memory_limit=24GB" \
    --variant "planned for 24GB, full AC: train.gpu_memory_limit=24GB parallel.activation_checkpointing=full parallel.ac_blocks=null"
}
gpu_tests() {  # the GPU-only tests of this round: FP8 training and the fused head's kernels
  timeout 240 python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py -k "fp8 or head or loss" > "$root/gpu-tests.txt" 2>&1
  tail -5 "$root/gpu-tests.txt"
}
bundle() {  # every result so far into one file (a device call returns only a few files)
  python3 benchmarks/bundle_results.py "$root" "${BUNDLE:-$root/all-results.json}"
}
mkdir -p "$root"
case $phase in
c1) head_1b; thirteen_b; fp32_8b ;;
c2) prebuild & offload24; wait; fp8_8b; builtin_vs_hf ;;
c3) prebuild & heldout; wait; bundle ;;
c8) prebuild & HELDOUT="b:8:250 d:8:280" heldout; wait; bundle ;;
c6) prebuild & offload24; wait; bundle; zero3_8b; bundle; gpu_tests ;;
c7) gpu_tests; bundle ;;
c9) fsdp_offload24; bundle ;;
c10) prebuild & OFFLOAD24_COMPILE=1 offload24; wait; bundle ;;
c10b) prebuild & wait; compiled36; bundle ;;
c11) prebuild & fsdp_offload24; wait; bundle; HELDOUT="${HELDOUT:-a:8:230}" heldout; bundle ;;
c12) prebuild & HELDOUT="${HELDOUT:-c:8:280 b:8:250}" heldout; wait; bundle ;;
c13) prebuild; levers24; bundle ;;
c14) prebuild & HELDOUT="a:8:280" HELDOUT_RUN_S=70 heldout; wait; bundle ;;
c15) prebuild; profile36; bundle ;;
c16) fp32_8b_first_k; bundle ;;
c17) first_k_why; bundle ;;
c18) prebuild; first_k24; bundle ;;
c19) fp32_8b_accum; bundle ;;
c4) fp8_8b; bundle; builtin_vs_hf; bundle ;;
c5) fp8_loss_1b; bundle ;;
*) echo "unknown phase $phase"; exit 2 ;;
esac
for log in "$root"/*/logs/*.log; do
  [ -f "$log" ] || continue
  grep -qE "^(error|Traceback)|Error" "$log" && { echo "== $log"; grep -v "^\[20" "$log" | grep -E "Error|error|Killed|memory" | tail -4 | cut -c1-400; }
done
bundle
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
