#!/usr/bin/env bash
# Issue 7 on one H200: checkpoints across engines in the GPU regime (bf16 compute, fp32 master
# weights and AdamW states; DeepSpeed's own fused/BF16 optimizers), and what integrity costs.
#   bash benchmarks/checkpoint_h200.sh resume OUT   # engine A trains 10 steps (checkpoint at 5);
#                                                   # engine B resumes step 5; losses compared
#   bash benchmarks/checkpoint_h200.sh cost OUT     # llama3-1b fp32-master checkpoint: manifest
#                                                   # verification (cold/warm), export time + RSS
# Needs zerofit and DeepSpeed importable (the device prelude is in docs/benchmarks/).
set -uo pipefail
phase=${1:?phase: resume | cost}
root=${2:-ckpt-out}
mkdir -p "$root"
arch=${TORCH_CUDA_ARCH_LIST:-9.0}
export TORCH_CUDA_ARCH_LIST=${arch/9.0a/9.0}  # DeepSpeed's JIT op build rejects "9.0a"
common=(--model.preset small --model.seq_len 512 --data.max_tokens 2000000 --train.steps 10
        --train.micro_batch_size 8 --train.eval_every 0 --log.every 1 --log.progress false
        --checkpoint.every 5 --checkpoint.keep_last 3 --precision.mode bf16 --optim.lr 1e-3)
declare -A engine=(
  [fsdp]="--parallel.backend fsdp"
  [ddp]="--parallel.backend ddp"
  [z1]="--parallel.backend deepspeed --parallel.deepspeed.stage 1"
  [z2-offload]="--parallel.backend deepspeed --parallel.deepspeed.stage 2 --parallel.deepspeed.offload_optimizer cpu"
  [z3]="--parallel.backend deepspeed --parallel.deepspeed.stage 3"
)
train() {  # name, engine, extra args...
  local name=$1 e=$2; shift 2
  python3 -m zerofit.cli train "${common[@]}" ${engine[$e]} --log.run_dir "$root/$name" --nproc 1 "$@" \
    > "$root/$name.log" 2>&1 || { echo "FAILED $name"; grep -E "^error|Error" "$root/$name.log" | tail -3; }
}
pair() {  # source engine, target engine
  local a=$1 b=$2
  [ -d "$root/full-$a" ] || train "full-$a" "$a"
  mkdir -p "$root/$a-to-$b/checkpoints"
  cp -r "$root/full-$a/checkpoints/step_00000005" "$root/$a-to-$b/checkpoints/"
  train "$a-to-$b" "$b" --resume
}
source "$(dirname "$0")/bench_lib.sh"  # zf_prebuild
case $phase in
resume)
  zf_prebuild
  pair fsdp z3; pair z3 fsdp; pair z1 fsdp; pair z2-offload ddp; pair fsdp fsdp; pair z3 z3
  python3 benchmarks/summarize_resume.py "$root" | tee "$root/resume.md"
  ;;
cost)
  python3 -m zerofit.cli train --model.preset llama3-1b --model.seq_len 1024 --train.steps 2 \
    --train.micro_batch_size 1 --train.eval_every 0 --log.progress false --data.max_tokens 200000 \
    --precision.mode bf16 --precision.master_dtype fp32 --parallel.backend fsdp --nproc 1 \
    --log.run_dir "$root/1b" > "$root/1b.log" 2>&1 || tail -5 "$root/1b.log"
  python3 benchmarks/checkpoint_cost.py "$root/1b/checkpoints/step_00000002" "$root/1b" "$root/cost.json"
  ;;
*) echo "unknown phase $phase"; exit 2 ;;
esac
df -h "$root" | tail -1; free -g | head -2
