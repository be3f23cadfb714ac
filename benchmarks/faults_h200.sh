#!/usr/bin/env bash
# Issue 8 on one H200: what the per-step agreement costs, and what a preemption takes.
#   OLD_SRC=path/to/old/src bash benchmarks/faults_h200.sh overhead OUT
#       `zerofit bench`, same configs, with the source before the per-step gate (OLD_SRC) and
#       with this tree's: llama3-1b seq 2048 (short steps: most sensitive) and the 8B headline.
#   bash benchmarks/faults_h200.sh preempt OUT
#       llama3-1b (fp32 master + AdamW, 18 GB of checkpoint), FSDP and ZeRO-3: SIGTERM to the
#       launcher mid-run; seconds to exit, exit status and line; then --resume to the end.
#       Then a worker killed with SIGKILL under train.max_restarts=1 (restart, same final loss).
# Needs zerofit and DeepSpeed importable (the device prelude is in docs/benchmarks/).
set -uo pipefail
phase=${1:?phase: overhead | preempt}
root=${2:-faults-out}
runs=${RUNS:-/tmp/faults-runs}  # run directories (checkpoints are big): outside OUT
mkdir -p "$root" "$runs"
arch=${TORCH_CUDA_ARCH_LIST:-9.0}
export TORCH_CUDA_ARCH_LIST=${arch/9.0a/9.0}
export PYTORCH_CUDA_ALLOC_CONF=${PYTORCH_CUDA_ALLOC_CONF:-expandable_segments:True}
pure="precision.master_dtype=bf16 precision.reduce_dtype=bf16"
bench() {  # src, out-subdir, timeout, args...
  local src=$1 sub=$2 limit=$3; shift 3
  PYTHONPATH=$src:$(echo "$PYTHONPATH" | sed "s#[^:]*/src##") python3 -m zerofit.cli bench \
    --warmup 3 --steps 15 --timeout "$limit" --out "$root/$sub" "$@" 2>&1 | grep -E "tokens/s|error" | head -4
}
overhead() {
  local new=$PWD/src old=${OLD_SRC:?set OLD_SRC}
  for round in 1 2; do
    bench "$old" "1b-before-$round" 90 -c configs/bench/llama3-1b-seq2048.yaml
    bench "$new" "1b-after-$round" 90 -c configs/bench/llama3-1b-seq2048.yaml
  done
  bench "$old" 8b-before 120 -c configs/bench/llama3-8b-seq4096.yaml --variant "fsdp: $pure train.micro_batch_size=2 train.grad_accum_steps=2"
  bench "$new" 8b-after 120 -c configs/bench/llama3-8b-seq4096.yaml --variant "fsdp: $pure train.micro_batch_size=2 train.grad_accum_steps=2"
}
preempt_one() {  # name, engine args...
  local name=$1; shift
  local dir=$runs/$name
  python3 -m zerofit.cli train -c configs/bench/llama3-1b-seq2048.yaml --train.steps 40 \
    --train.micro_batch_size 4 --log.every 1 --log.progress false --checkpoint.save_final true \
    --log.run_dir "$dir" "$@" > "$root/$name.out" 2> "$root/$name.err" &
  local pid=$!
  until grep -q '"step": 8' "$dir/metrics.jsonl" 2>/dev/null; do sleep 0.2; kill -0 $pid 2>/dev/null || break; done
  local t0=$(date +%s.%N); kill -TERM $pid; wait $pid; local rc=$?; local t1=$(date +%s.%N)
  python3 - "$name" "$rc" "$t0" "$t1" "$root" "$runs" <<'PY'
import json, sys, pathlib
name, rc, t0, t1, root, runs = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4]), sys.argv[5], sys.argv[6]
err = pathlib.Path(root, f"{name}.err").read_text().strip().splitlines()
steps = [json.loads(l)["step"] for l in pathlib.Path(runs, name, "metrics.jsonl").read_text().splitlines()]
rec = {"case": name, "signal": "SIGTERM", "exit_status": rc, "seconds_to_exit": round(t1 - t0, 2),
       "last_logged_step": max(steps), "line": err[-1] if err else "", "stderr_lines": len(err)}
print(json.dumps(rec))
with open(pathlib.Path(root, "preempt.jsonl"), "a") as f:
    f.write(json.dumps(rec) + "\n")
PY
  sed -i 's/steps: 40/steps: 12/' "$dir/config.yaml"
  python3 -m zerofit.cli train -c "$dir/config.yaml" --resume > "$root/$name.resume.out" 2>&1
  echo "$name resume rc=$? $(grep -o '"final_step_loss": [0-9.]*' "$dir/summary.json")"
  tail -2 "$root/$name.resume.out" | cut -c1-300
  rm -rf "$dir/checkpoints"
}
restart_one() {
  local dir=$runs/restart args=(-c configs/bench/llama3-1b-seq2048.yaml --train.steps 14 --train.micro_batch_size 4
    --log.every 1 --log.progress false --checkpoint.every 4 --checkpoint.save_final false)
  python3 -m zerofit.cli train "${args[@]}" --log.run_dir "$runs/reference" > "$root/reference.out" 2>&1
  python3 -m zerofit.cli train "${args[@]}" --train.max_restarts 1 --log.run_dir "$dir" > "$root/restart.out" 2> "$root/restart.err" &
  local pid=$!
  until grep -q '"step": 6' "$dir/metrics.jsonl" 2>/dev/null; do sleep 0.2; kill -0 $pid 2>/dev/null || break; done
  for c in $(pgrep -P $pid); do kill -9 "$c"; done
  wait $pid; echo "restart rc=$?"; grep note "$root/restart.out"
  grep -h -o '"final_step_loss": [0-9.]*' "$runs/reference/summary.json" "$dir/summary.json"
  tail -2 "$root/restart.err" | cut -c1-300
}
case $phase in
overhead) overhead ;;
preempt)
  [ -n "${ONLY:-}" ] && { $ONLY; exit; }
  python3 -c "from deepspeed.ops.op_builder import FusedAdamBuilder; FusedAdamBuilder().load()" > "$root/prebuild.log" 2>&1
  preempt_one fsdp --parallel.backend fsdp
  preempt_one zero3 --parallel.backend deepspeed --parallel.deepspeed.stage 3
  restart_one ;;
*) echo "unknown phase $phase"; exit 2 ;;
esac
