#!/usr/bin/env bash
# Where a training step's host time goes: `zerofit train` on one GPU, sampled by py-spy once the
# compile warm-up is over (py-spy's wheel carried in .whl: the prelude puts it in /tmp/site/bin).
#   bash benchmarks/host_probe.sh FIXTURE OUT DELAY SECONDS [--section.key value ...]
# DELAY: seconds after the start before sampling (past compilation); SECONDS: how long to sample.
# Writes OUT/spy.txt (py-spy's collapsed stacks, every thread and process of the run, idle
# threads left out), OUT/train.log and OUT/run/ (the run folder: metrics.jsonl has the step times).
set -uo pipefail
fix=${1:?fixture folder}
out=${2:?output folder}
delay=${3:?seconds before sampling}
span=${4:?seconds to sample}
shift 4
mkdir -p "$out"
spy=$(command -v py-spy || echo /tmp/site/bin/py-spy)
python3 -m zerofit.cli train -c configs/finetune-qlora.yaml --model.hf "$fix/model-8b" \
  --data.source "$fix/chat.jsonl" --model.random_init true --data.val_fraction 0 \
  --train.eval_every 0 --checkpoint.every 0 --checkpoint.save_final false \
  --checkpoint.export_final false --log.every 1 --log.run_dir "$out/run" "$@" \
  > "$out/train.log" 2>&1 &
pid=$!
sleep "$delay"
if kill -0 "$pid" 2>/dev/null; then
  "$spy" record --subprocesses --threads --nonblocking --rate 200 --format raw -d "$span" -p "$pid" \
    -o "$out/spy.txt" > "$out/spy.log" 2>&1 || tail -3 "$out/spy.log"
fi
kill "$pid" 2>/dev/null
wait "$pid" 2>/dev/null
grep -v "^\[20" "$out/train.log" | tail -4 | cut -c1-300
