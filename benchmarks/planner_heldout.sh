#!/usr/bin/env bash
# The planner held out (issue 27, item 4): eight configurations that no planner constant was fitted
# on, run as written with `zerofit bench` on one H100 or H200, then forecast with the checkout's
# planner (tools/planner_residuals.py --results). One device call, under ~9 minutes:
#   source benchmarks/device_prelude.sh && bash benchmarks/planner_heldout.sh OUT
# (carry .whl: DeepSpeed runs four of them). The host term's fit set is
# docs/benchmarks/data/2026-12-04-planner-heldout/a-measured.json (llama3-1b, seq 1024, 4 x 1,
# bf16 masters, eager); none of these is that configuration, and none of their shapes, splits or
# engine options is one a constant was fitted on:
#   zero1-bf16     ZeRO-1, bf16 master weights and states, eager, llama3-1b at 2 x 2048, 2 micro-batches
#   ddp-every2     DDP, every second block recomputed, eager, llama3-1b at 4 x 2048, fp32 masters
#   zero3-cpu      ZeRO-3 with the optimizer on the CPU, eager, a 2.9B shape (32 x 2560) at 2 x 2048 x 2
#   fsdp-eager     FSDP2 eager at 2 x 1024 x 2 on a 2.1B shape (26 x 2304): the host term's FSDP part
#   zero2-ac       ZeRO-2 + full AC, eager, the 2.1B shape at 1 x 2048 x 2
#   fp32-s8192     FSDP2 compiled, fp32 masters, llama3-1b at seq 8192 (1 x 8192 x 2)
#   fsdp-compiled  FSDP2 compiled, bf16 masters, the 2.1B shape at 2 x 4096
#   lora-first8    llama3-8b LoRA r64 (all linear layers), first 8 blocks recomputed, FSDP2
#                  compiled, 2 x 2048 x 2
# Each runs 3 warm-up steps (so that no timed step records CUDA allocations) and 4 timed ones.
# Everything goes into OUT/all-results.json; the forecast table into OUT/heldout-table.md and
# OUT/heldout-forecast.json. Commit OUT/all-results.json's groups under
# docs/benchmarks/data/<date>-planner-heldout-<card>/ and the table in a write-up.
set -uo pipefail
root=${1:-heldout-out}
deadline=${DEADLINE:-540}
export PYTORCH_CUDA_ALLOC_CONF=${PYTORCH_CUDA_ALLOC_CONF:-expandable_segments:True}
source "$(dirname "$0")/bench_lib.sh"
mkdir -p "$root"

base=(--nproc 1 --data.source stdlib --data.tokenizer byte --data.max_tokens 1000000 --train.eval_every 0
  --checkpoint.save_final false --precision.mode bf16 --optim.warmup_steps 2 --log.every 1000)
s21="{dim: 2304, n_layers: 26, n_heads: 18, n_kv_heads: 6, ffn_dim: 6144}"  # 2.06B
s29="{dim: 2560, n_layers: 32, n_heads: 20, n_kv_heads: 4, ffn_dim: 6912}"  # 2.86B

left() { echo $((deadline - SECONDS)); }
run() {  # run NAME TIMEOUT ARGS...: one bench group, skipped when the deadline is too close
  local name=$1 limit=$2; shift 2
  if [ -n "${ONLY:-}" ] && [[ " $ONLY " != *" $name "* ]]; then return; fi  # ONLY="a b": those
  if [ "$(left)" -lt "$limit" ]; then limit=$(left); fi
  if [ "$limit" -lt 45 ]; then echo "== $name: skipped, out of time"; return; fi
  echo "== $name (at most ${limit}s, $(left)s left)"
  zf_bench "$name" "$limit" 3 "${STEPS:-4}" "${base[@]}" "$@"  # STEPS=10: steadier medians
}

# The host's launch and hook rates, timed on this machine (`zerofit plan --host-probe`), before
# and after the runs: tools/planner_residuals.py forecasts the runs of this folder with the first
# (planner_corpus.probed_host); the second says how much the probe moves within one call.
probe() { python3 -m zerofit.cli plan --preset llama3-1b --gpus 1 --host-probe --json > "$1" 2> "$1.log" || tail -3 "$1.log"; }
probe "$root/host-probe.json"
# DeepSpeed's fused and CPU Adam build before any run, on every core: built beside the first
# (torch-only) runs, as the calls up to the fifth did, they shared the host those runs' speed
# depends on (the fourth call's first run, compiled DDP, measured 0.083 s; the same config
# 0.068 s in the fifth, as its third run). The `wait`s below now return at once.
[ "${PREBUILD:-1}" = 1 ] && MAX_JOBS=16 zf_prebuild  # PREBUILD=0: no run needs FusedAdam
# The fourth call's (2026-12-06, after ZeRO-1/2's and compiled FSDP2's hooks were probed apart,
# the offloaded step's rate taken from two sizes, and the ZeRO-3 probe's persistence set): four
# of the third call's configurations that did not run then, and three new ones, none run before.
# Torch-only first, while DeepSpeed's ops build:
#   new4-fsdp-c29      FSDP2 compiled, the 2.9B shape at 1 x 512 x 2: compiled FSDP2's hooks alone
#   new4-zero1-21      ZeRO-1 eager, the 2.1B shape at 1 x 512 x 2: ZeRO-1's gradient hooks
#   new4-zero3-29      ZeRO-3 eager, the 2.9B shape at 1 x 512 x 2: ZeRO-3's hooks on a new shape
run new3-ddp-compiled 75 --model.preset llama3-1b --model.seq_len 1024 \
  --variant "ddp compiled 1x1024 x2: train.micro_batch_size=1 train.grad_accum_steps=2 precision.master_dtype=bf16 parallel.backend=ddp parallel.compile=true"
run new3-fsdp-offload 90 --model.preset llama3-1b --model.seq_len 2048 \
  --variant "fsdp cpu offload eager 2x1: train.micro_batch_size=2 train.grad_accum_steps=1 precision.master_dtype=fp32 parallel.backend=fsdp parallel.fsdp.cpu_offload=true parallel.compile=false"
run new4-fsdp-c29 75 --model.preset llama3-1b --model.overrides "$s29" --model.seq_len 512 \
  --variant "fsdp compiled 1x512 x2: train.micro_batch_size=1 train.grad_accum_steps=2 precision.master_dtype=bf16 parallel.backend=fsdp parallel.compile=true"
# The fifth call's (2026-12-07, after ZeRO-1's hooks were counted on the accumulation boundary
# only), none run before; the profiled ones profile 2 steps after the timed ones (their time
# breakdown: whether the GPU or the host decides a compiled DDP step):
#   new5-ddp-c21       DDP compiled, the 2.1B shape at 1 x 512 x 2, profiled
#   new5-zero1-29      ZeRO-1 eager, the 2.9B shape at 1 x 512 x 4: hooks on the boundary only
#   new3-ddp-compiled  again (profiled, not held out: the fourth call ran it) as new5-ddp-c15p
run new5-ddp-c21 75 --model.preset llama3-1b --model.overrides "$s21" --model.seq_len 512 --profile 2 \
  --variant "ddp compiled 1x512 x2: train.micro_batch_size=1 train.grad_accum_steps=2 precision.master_dtype=bf16 parallel.backend=ddp parallel.compile=true"
run new5-ddp-c15p 75 --model.preset llama3-1b --model.seq_len 1024 --profile 2 \
  --variant "ddp compiled 1x1024 x2: train.micro_batch_size=1 train.grad_accum_steps=2 precision.master_dtype=bf16 parallel.backend=ddp parallel.compile=true"
# The sixth call's (2026-12-07, after the offloaded AdamW's probe took in the clipping, and
# ZeRO-1's hooks off the accumulation boundary were probed), none run before:
#   new6-offload-21    FSDP2 CPU offload eager, the 2.1B shape at 1 x 2048: the host step's probe
#   new6-ddp-c29       DDP compiled, the 2.9B shape at 1 x 512 x 2
#   new6-fsdp-c21x3    FSDP2 compiled, the 2.1B shape at 1 x 1024 x 3
#   new6-zero1-21x3    ZeRO-1 eager, the 2.1B shape at 1 x 512 x 3: hooks off the boundary
#   new6-zero1-15x4    ZeRO-1 eager, llama3-1b at 1 x 1024 x 4
#   new6-zero3-15x3    ZeRO-3 eager, llama3-1b at 1 x 512 x 3
# The seventh call's (2026-12-07, after the probe timed PCIe), none run before:
#   new7-offload-29    FSDP2 CPU offload eager, the 2.9B shape at 1 x 1024
#   new7-offload-15x2  FSDP2 CPU offload eager, llama3-1b at 1 x 1024 x 2
#   new7-zero3-cpu-15  ZeRO-3 + optimizer on the CPU, fp32 states, llama3-1b at 1 x 2048
# The eighth call's (2026-12-07), not held out: two of the sixth call's runs again, profiled
# for where their time goes (ZeRO-1 under-forecast by 26%, ZeRO-3 over by 27%):
#   new8-zero1-15x4p   new6-zero1-15x4 again, 2 steps profiled
#   new8-zero3-15x3p   new6-zero3-15x3 again, 2 steps profiled
run new8-zero1-15x4p 75 --model.preset llama3-1b --model.seq_len 1024 --profile 2 \
  --variant "zero1 eager 1x1024 x4: train.micro_batch_size=1 train.grad_accum_steps=4 precision.master_dtype=bf16 parallel.backend=deepspeed parallel.deepspeed.stage=1 parallel.compile=false"
run new8-zero3-15x3p 75 --model.preset llama3-1b --model.seq_len 512 --profile 2 \
  --variant "zero3 eager 1x512 x3: train.micro_batch_size=1 train.grad_accum_steps=3 precision.master_dtype=bf16 parallel.backend=deepspeed parallel.deepspeed.stage=3 parallel.compile=false"
# The ninth call's (2026-12-07, after zerofit's DeepSpeed JSON turned off DeepSpeed's throughput
# timer, which synchronises the device twice a micro-batch), none run before; each beside the
# same with the timer on as DeepSpeed's default has it (benchmarks/ds_timer_on.json: the old
# behaviour, not held out), in one process each, one after the other:
#   new9-zero1-29x2    ZeRO-1 eager, the 2.9B shape at 1 x 1024 x 2
#   new9-zero2-29x3    ZeRO-2 eager, the 2.9B shape at 1 x 512 x 3
#   new9-zero3-21x4    ZeRO-3 eager, the 2.1B shape at 1 x 512 x 4
#   new9-zero1-21big   ZeRO-1 eager, bf16 states, the 2.1B shape at 2 x 2048 x 2 (GPU-bound)
timer="parallel.deepspeed.config=benchmarks/ds_timer_on.json"
pair() {  # pair NAME TIMEOUT MODEL-ARGS -- VARIANT-NAME OVERRIDES: the variant and it with the timer
  local name=$1 limit=$2; shift 2; local model=(); while [ "$1" != -- ]; do model+=("$1"); shift; done
  shift; local vname=$1 over=$2
  run "$name" "$limit" "${model[@]}" --variant "$vname: $over" --variant "$vname timer on: $over $timer"
}
z="precision.master_dtype=bf16 parallel.backend=deepspeed parallel.compile=false"
pair new9-zero1-29x2 110 --model.preset llama3-1b --model.overrides "$s29" --model.seq_len 1024 -- \
  "zero1 eager 1x1024 x2" "train.micro_batch_size=1 train.grad_accum_steps=2 $z parallel.deepspeed.stage=1"
pair new9-zero3-21x4 110 --model.preset llama3-1b --model.overrides "$s21" --model.seq_len 512 -- \
  "zero3 eager 1x512 x4" "train.micro_batch_size=1 train.grad_accum_steps=4 $z parallel.deepspeed.stage=3"
pair new9-zero1-21big 110 --model.preset llama3-1b --model.overrides "$s21" --model.seq_len 2048 -- \
  "zero1 eager 2x2048 x2" "train.micro_batch_size=2 train.grad_accum_steps=2 $z parallel.deepspeed.stage=1"
pair new9-zero2-29x3 110 --model.preset llama3-1b --model.overrides "$s29" --model.seq_len 512 -- \
  "zero2 eager 1x512 x3" "train.micro_batch_size=1 train.grad_accum_steps=3 $z parallel.deepspeed.stage=2"
# The tenth call's (2026-12-07, after benchmarks/ds_spy.sh found ZeRO-1/2's step waiting on the
# GPU before it reads the gradient norm), none run before, DeepSpeed's throughput timer off as
# zerofit now runs it: held out for today's planner and for a charge of those waits:
#   new10-zero1-15x2   ZeRO-1 eager, llama3-1b at 1 x 2048 x 2
#   new10-zero2-15x1   ZeRO-2 eager, llama3-1b at 1 x 1024 x 1
#   new10-zero1-21x1   ZeRO-1 eager, the 2.1B shape at 1 x 1024 x 1
#   new10-zero2-29x2   ZeRO-2 eager, the 2.9B shape at 1 x 1024 x 2
run new10-zero1-15x2 75 --model.preset llama3-1b --model.seq_len 2048 \
  --variant "zero1 eager 1x2048 x2: train.micro_batch_size=1 train.grad_accum_steps=2 $z parallel.deepspeed.stage=1"
run new10-zero2-15x1 75 --model.preset llama3-1b --model.seq_len 1024 \
  --variant "zero2 eager 1x1024 x1: train.micro_batch_size=1 train.grad_accum_steps=1 $z parallel.deepspeed.stage=2"
run new10-zero1-21x1 75 --model.preset llama3-1b --model.overrides "$s21" --model.seq_len 1024 \
  --variant "zero1 eager 1x1024 x1: train.micro_batch_size=1 train.grad_accum_steps=1 $z parallel.deepspeed.stage=1"
run new10-zero2-29x2 90 --model.preset llama3-1b --model.overrides "$s29" --model.seq_len 1024 \
  --variant "zero2 eager 1x1024 x2: train.micro_batch_size=1 train.grad_accum_steps=2 $z parallel.deepspeed.stage=2"
run new7-offload-29 110 --model.preset llama3-1b --model.overrides "$s29" --model.seq_len 1024 \
  --variant "fsdp cpu offload eager 1x1: train.micro_batch_size=1 train.grad_accum_steps=1 precision.master_dtype=fp32 parallel.backend=fsdp parallel.fsdp.cpu_offload=true parallel.compile=false"
run new7-offload-15x2 90 --model.preset llama3-1b --model.seq_len 1024 \
  --variant "fsdp cpu offload eager 1x1024 x2: train.micro_batch_size=1 train.grad_accum_steps=2 precision.master_dtype=fp32 parallel.backend=fsdp parallel.fsdp.cpu_offload=true parallel.compile=false"
run new7-zero3-cpu-15 100 --model.preset llama3-1b --model.seq_len 2048 \
  --variant "zero3 optim cpu eager 1x1: train.micro_batch_size=1 train.grad_accum_steps=1 precision.master_dtype=fp32 parallel.backend=deepspeed parallel.deepspeed.stage=3 parallel.deepspeed.offload_optimizer=cpu parallel.compile=false"
run new6-offload-21 100 --model.preset llama3-1b --model.overrides "$s21" --model.seq_len 2048 \
  --variant "fsdp cpu offload eager 1x1: train.micro_batch_size=1 train.grad_accum_steps=1 precision.master_dtype=fp32 parallel.backend=fsdp parallel.fsdp.cpu_offload=true parallel.compile=false"
run new6-ddp-c29 75 --model.preset llama3-1b --model.overrides "$s29" --model.seq_len 512 \
  --variant "ddp compiled 1x512 x2: train.micro_batch_size=1 train.grad_accum_steps=2 precision.master_dtype=bf16 parallel.backend=ddp parallel.compile=true"
run new6-fsdp-c21x3 75 --model.preset llama3-1b --model.overrides "$s21" --model.seq_len 1024 \
  --variant "fsdp compiled 1x1024 x3: train.micro_batch_size=1 train.grad_accum_steps=3 precision.master_dtype=bf16 parallel.backend=fsdp parallel.compile=true"
wait
run new6-zero1-21x3 60 --model.preset llama3-1b --model.overrides "$s21" --model.seq_len 512 \
  --variant "zero1 eager 1x512 x3: train.micro_batch_size=1 train.grad_accum_steps=3 precision.master_dtype=bf16 parallel.backend=deepspeed parallel.deepspeed.stage=1 parallel.compile=false"
run new6-zero1-15x4 60 --model.preset llama3-1b --model.seq_len 1024 \
  --variant "zero1 eager 1x1024 x4: train.micro_batch_size=1 train.grad_accum_steps=4 precision.master_dtype=bf16 parallel.backend=deepspeed parallel.deepspeed.stage=1 parallel.compile=false"
run new6-zero3-15x3 60 --model.preset llama3-1b --model.seq_len 512 \
  --variant "zero3 eager 1x512 x3: train.micro_batch_size=1 train.grad_accum_steps=3 precision.master_dtype=bf16 parallel.backend=deepspeed parallel.deepspeed.stage=3 parallel.compile=false"
wait
run new4-zero1-21 60 --model.preset llama3-1b --model.overrides "$s21" --model.seq_len 512 \
  --variant "zero1 eager 1x512 x2: train.micro_batch_size=1 train.grad_accum_steps=2 precision.master_dtype=bf16 parallel.backend=deepspeed parallel.deepspeed.stage=1 parallel.compile=false"
run new4-zero3-29 60 --model.preset llama3-1b --model.overrides "$s29" --model.seq_len 512 \
  --variant "zero3 eager 1x512 x2: train.micro_batch_size=1 train.grad_accum_steps=2 precision.master_dtype=bf16 parallel.backend=deepspeed parallel.deepspeed.stage=3 parallel.compile=false"
run new3-zero2-21 60 --model.preset llama3-1b --model.overrides "$s21" --model.seq_len 512 \
  --variant "zero2 eager 1x512 x2: train.micro_batch_size=1 train.grad_accum_steps=2 precision.master_dtype=bf16 parallel.backend=deepspeed parallel.deepspeed.stage=2 parallel.compile=false"
run new5-zero1-29 60 --model.preset llama3-1b --model.overrides "$s29" --model.seq_len 512 \
  --variant "zero1 eager 1x512 x4: train.micro_batch_size=1 train.grad_accum_steps=4 precision.master_dtype=bf16 parallel.backend=deepspeed parallel.deepspeed.stage=1 parallel.compile=false"
run new3-zero3-cpu-bf16 90 --model.preset llama3-1b --model.seq_len 2048 \
  --variant "zero3 optim cpu bf16 eager 2x1: train.micro_batch_size=2 train.grad_accum_steps=1 precision.master_dtype=bf16 parallel.backend=deepspeed parallel.deepspeed.stage=3 parallel.deepspeed.offload_optimizer=cpu parallel.compile=false"
# Four new configurations (2026-12-06, after the probe was built), none in any earlier file:
#   new-ddp-short      DDP eager, llama3-1b at 1 x 512 x 2: launches alone decide it
#   new-fsdp-short     FSDP2 eager, llama3-1b at 1 x 1024 x 2: FSDP2's hooks and launches
#   new-fsdp-cshort    FSDP2 compiled, llama3-1b at 1 x 1024 x 2: compiled launches at the eager rate
#   new-zero3-short    ZeRO-3 eager, the 2.1B shape at 1 x 1024 x 2: DeepSpeed's hooks at FSDP2's rate
run new-ddp-short 50 --model.preset llama3-1b --model.seq_len 512 \
  --variant "ddp eager 1x512 x2: train.micro_batch_size=1 train.grad_accum_steps=2 precision.master_dtype=bf16 parallel.backend=ddp parallel.compile=false"
run new-fsdp-short 50 --model.preset llama3-1b --model.seq_len 1024 \
  --variant "fsdp eager 1x1024 x2: train.micro_batch_size=1 train.grad_accum_steps=2 precision.master_dtype=bf16 parallel.backend=fsdp parallel.compile=false"
run new-fsdp-cshort 75 --model.preset llama3-1b --model.seq_len 1024 \
  --variant "fsdp compiled 1x1024 x2: train.micro_batch_size=1 train.grad_accum_steps=2 precision.master_dtype=bf16 parallel.backend=fsdp parallel.compile=true"
run ddp-every2 60 --model.preset llama3-1b --model.seq_len 2048 \
  --variant "ddp AC every 2 eager 4x1: train.micro_batch_size=4 train.grad_accum_steps=1 precision.master_dtype=fp32 parallel.backend=ddp parallel.activation_checkpointing=every_k parallel.ac_every=2 parallel.compile=false"
run fsdp-eager 60 --model.preset llama3-1b --model.overrides "$s21" --model.seq_len 1024 \
  --variant "fsdp eager 2x2: train.micro_batch_size=2 train.grad_accum_steps=2 precision.master_dtype=bf16 parallel.backend=fsdp parallel.compile=false"
wait
# Two more (2026-12-06, second call, after the engines' own hook probes were built):
#   new2-zero2-short   ZeRO-2 eager, llama3-1b at 1 x 1024 x 2: DeepSpeed's gradient hooks
#   new2-gradop-short  FSDP2 grad-op (no reshard after forward) eager, the 2.1B shape at 1 x 1024 x 2
run new2-zero2-short 60 --model.preset llama3-1b --model.seq_len 1024 \
  --variant "zero2 eager 1x1024 x2: train.micro_batch_size=1 train.grad_accum_steps=2 precision.master_dtype=bf16 parallel.backend=deepspeed parallel.deepspeed.stage=2 parallel.compile=false"
run new2-gradop-short 50 --model.preset llama3-1b --model.overrides "$s21" --model.seq_len 1024 \
  --variant "fsdp grad-op eager 1x1024 x2: train.micro_batch_size=1 train.grad_accum_steps=2 precision.master_dtype=bf16 parallel.backend=fsdp parallel.fsdp.reshard_after_forward=false parallel.compile=false"
# Seven more (2026-12-06, third call, after the probe timed each engine alone and sharded, and
# the offloaded optimizer steps), none run before:
#   new3-zero3-w1      ZeRO-3 eager, llama3-1b at 1 x 512 x 2: DeepSpeed's hooks for a rank alone
#   new3-fsdp-29       FSDP2 eager, the 2.9B shape at 1 x 512: FSDP2's hooks on another shape
#   new3-zero2-21      ZeRO-2 eager, the 2.1B shape at 1 x 512 x 2
#   new3-ddp-compiled  DDP compiled, llama3-1b at 1 x 1024 x 2: compiled launches alone
#   new3-zero3-cpu-bf16  ZeRO-3 + optimizer on the CPU, bf16 states, llama3-1b at 2 x 2048
#   new3-zero3-cpu-21  ZeRO-3 + optimizer on the CPU, fp32 states, the 2.1B shape at 1 x 1024 x 2
#   new3-fsdp-offload  FSDP2 CPU offload (fused CPU AdamW), llama3-1b at 2 x 2048
run new3-zero3-w1 60 --model.preset llama3-1b --model.seq_len 512 \
  --variant "zero3 eager 1x512 x2: train.micro_batch_size=1 train.grad_accum_steps=2 precision.master_dtype=bf16 parallel.backend=deepspeed parallel.deepspeed.stage=3 parallel.compile=false"
run new3-fsdp-29 60 --model.preset llama3-1b --model.overrides "$s29" --model.seq_len 512 \
  --variant "fsdp eager 1x512: train.micro_batch_size=1 train.grad_accum_steps=1 precision.master_dtype=bf16 parallel.backend=fsdp parallel.compile=false"
run new3-zero3-cpu-21 100 --model.preset llama3-1b --model.overrides "$s21" --model.seq_len 1024 \
  --variant "zero3 optim cpu eager 1x1024 x2: train.micro_batch_size=1 train.grad_accum_steps=2 precision.master_dtype=fp32 parallel.backend=deepspeed parallel.deepspeed.stage=3 parallel.deepspeed.offload_optimizer=cpu parallel.compile=false"
run new-zero3-short 75 --model.preset llama3-1b --model.overrides "$s21" --model.seq_len 1024 \
  --variant "zero3 eager 1x1024 x2: train.micro_batch_size=1 train.grad_accum_steps=2 precision.master_dtype=bf16 parallel.backend=deepspeed parallel.deepspeed.stage=3 parallel.compile=false"
run zero1-bf16 75 --model.preset llama3-1b --model.seq_len 2048 \
  --variant "zero1 bf16 states eager 2x2: train.micro_batch_size=2 train.grad_accum_steps=2 precision.master_dtype=bf16 parallel.backend=deepspeed parallel.deepspeed.stage=1 parallel.compile=false"
run zero3-cpu 110 --model.preset llama3-1b --model.overrides "$s29" --model.seq_len 2048 \
  --variant "zero3 optim cpu eager 2x2: train.micro_batch_size=2 train.grad_accum_steps=2 precision.master_dtype=fp32 parallel.backend=deepspeed parallel.deepspeed.stage=3 parallel.deepspeed.offload_optimizer=cpu parallel.compile=false"
run zero2-ac 60 --model.preset llama3-1b --model.overrides "$s21" --model.seq_len 2048 \
  --variant "zero2 AC eager 1x2: train.micro_batch_size=1 train.grad_accum_steps=2 precision.master_dtype=bf16 parallel.backend=deepspeed parallel.deepspeed.stage=2 parallel.activation_checkpointing=full parallel.compile=false"
run fp32-s8192 75 --model.preset llama3-1b --model.seq_len 8192 \
  --variant "fsdp fp32 seq 8192 compiled 1x2: train.micro_batch_size=1 train.grad_accum_steps=2 precision.master_dtype=fp32 parallel.backend=fsdp parallel.compile=true"
run fsdp-compiled 75 --model.preset llama3-1b --model.overrides "$s21" --model.seq_len 4096 \
  --variant "fsdp compiled 2x1: train.micro_batch_size=2 train.grad_accum_steps=1 precision.master_dtype=bf16 parallel.backend=fsdp parallel.compile=true"
run lora-first8 120 --model.preset llama3-8b --model.seq_len 2048 \
  --variant "lora r64 first 8 compiled 2x2: train.micro_batch_size=2 train.grad_accum_steps=2 model.lora.rank=64 parallel.backend=fsdp parallel.activation_checkpointing=first_k parallel.ac_blocks=8 parallel.compile=true"

[ "${PROBE_AFTER:-1}" = 1 ] && probe "$root/host-probe-after.json"  # PROBE_AFTER=0: a short call
python3 benchmarks/bundle_results.py "$root" "$root/all-results.json"
python3 tools/planner_residuals.py --results "$root" --json "$root/heldout-forecast.json" \
  > "$root/heldout-table.md" 2>&1
tail -n 20 "$root/heldout-table.md" | cut -c1-300
for log in "$root"/*/logs/*.log; do
  [ -f "$log" ] || continue
  grep -qE "^(error|Traceback)|Error" "$log" && { echo "== $log"; grep -v "^\[20" "$log" | grep -E "Error|error|Killed|memory" | tail -4 | cut -c1-400; }
done
