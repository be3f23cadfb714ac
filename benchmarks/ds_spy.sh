#!/usr/bin/env bash
# Where a host-bound DeepSpeed step goes (issue 27, item 4): three eager bf16 runs on one GPU, each
# `zerofit train` sampled by py-spy (idle samples kept, so that the host's waits on the GPU show)
# once DeepSpeed has started, as zerofit runs them since 2026-12-07 (throughput timer off):
#   z1  ZeRO-1, the 2.9B shape at 1 x 1024 x 2     (held out at -19.8% in the eighth call)
#   z2  ZeRO-2, the 2.9B shape at 1 x 512 x 3      (-26.3%)
#   z3  ZeRO-3, the 2.1B shape at 1 x 512 x 4      (+42.7%)
#   z2b ZeRO-2, the 2.9B shape at 1 x 1024 x 2     (the tenth call's held-out run the charge for
#       the step's waits over-shot: +27.8%)
#   source benchmarks/device_prelude.sh && ONLY="z3 z2b" bash benchmarks/ds_spy.sh $OUT
# (ONLY: those runs; all four without it.) Writes OUT/<run>-spy.txt.gz (py-spy's collapsed
# stacks), OUT/<run>-spy-summary.txt and OUT/all-results.json (each run's metrics.jsonl: the step
# times, sampled and not); the runs' folders and logs stay in /tmp/ds_spy (a device call brings
# back eight files at most).
set -uo pipefail
out=${1:?output folder}
root=/tmp/ds_spy
mkdir -p "$root" "$out"
spy=$(command -v py-spy || echo /tmp/site/bin/py-spy)
s21="{dim: 2304, n_layers: 26, n_heads: 18, n_kv_heads: 6, ffn_dim: 6144}"  # 2.06B
s29="{dim: 2560, n_layers: 32, n_heads: 20, n_kv_heads: 4, ffn_dim: 6912}"  # 2.86B
base=(--nproc 1 --model.preset llama3-1b --data.source stdlib --data.tokenizer byte
  --data.max_tokens 2000000 --train.eval_every 0 --checkpoint.every 0 --checkpoint.save_final false
  --precision.mode bf16 --precision.master_dtype bf16 --optim.warmup_steps 2 --log.every 1
  --parallel.backend deepspeed --parallel.compile false --train.micro_batch_size 1)

spied() {  # spied NAME STEPS SECONDS ARGS...: a run, sampled for SECONDS s once STEPS steps are logged
  local name=$1 steps=$2 span=$3; shift 3
  if [ -n "${ONLY:-}" ] && [[ " $ONLY " != *" $name "* ]]; then return; fi
  python3 -m zerofit.cli train "${base[@]}" --log.run_dir "$root/$name" "$@" \
    > "$root/$name.log" 2>&1 &
  local pid=$! waited=0
  # sample once STEPS steps have been logged (DeepSpeed's start-up over), waiting 120 s at most
  until [ "$(wc -l < "$root/$name/metrics.jsonl" 2>/dev/null || echo 0)" -ge "$steps" ] \
    || [ $waited -ge 120 ] || ! kill -0 "$pid" 2>/dev/null; do sleep 1; waited=$((waited + 1)); done
  if kill -0 "$pid" 2>/dev/null; then
    "$spy" record --subprocesses --threads --idle --nonblocking --rate 250 --format raw \
      -d "$span" -p "$pid" -o "$root/$name-spy.txt" > "$root/$name-spy.log" 2>&1 \
      || tail -3 "$root/$name-spy.log"
  fi
  sleep 3  # a few steps after the sampling, then stop the run
  kill -KILL "$pid" 2>/dev/null  # no stop-signal checkpoint: the workers die with the launcher
  wait "$pid" 2>/dev/null
  echo "== $name: exit $?"
  grep -v "^\[20" "$root/$name.log" | grep -E "step|rror" | tail -3 | cut -c1-200
  python3 benchmarks/spy_summary.py "$root/$name-spy.txt" 30 > "$out/$name-spy-summary.txt" 2>&1
  gzip -f "$root/$name-spy.txt" && cp "$root/$name-spy.txt.gz" "$out/"
}

nvidia-smi --query-gpu=name --format=csv,noheader
spied z2 6 12 --model.overrides "$s29" --model.seq_len 512 --train.grad_accum_steps 3 \
  --parallel.deepspeed.stage 2 --train.steps 400
spied z1 6 12 --model.overrides "$s29" --model.seq_len 1024 --train.grad_accum_steps 2 \
  --parallel.deepspeed.stage 1 --train.steps 400
spied z3 6 12 --model.overrides "$s21" --model.seq_len 512 --train.grad_accum_steps 4 \
  --parallel.deepspeed.stage 3 --train.steps 400
spied z2b 6 12 --model.overrides "$s29" --model.seq_len 1024 --train.grad_accum_steps 2 \
  --parallel.deepspeed.stage 2 --train.steps 400
python3 benchmarks/bundle_results.py "$root" "$out/all-results.json"
