# Sourced by core_1b.sh and engines_1b.sh (written before `zerofit bench` existed): one
# `zerofit train` per variant on configs/llama3-1b-fsdp.yaml, 40 steps, into OUT_DIR/<name>.
# RUN_TIMEOUT (seconds) bounds each run when set; RUN_TAIL lines of each run's output are shown.
out=${1:-bench-out}
mkdir -p "$out"
common=(-c configs/llama3-1b-fsdp.yaml --train.steps 40 --log.every 5 --log.progress false --checkpoint.save_final false)
run() {  # name, extra args...
  local name=$1; shift
  echo "=== $name: zerofit train ${common[*]} $*"
  ${RUN_TIMEOUT:+timeout "$RUN_TIMEOUT"} python3 -m zerofit.cli train "${common[@]}" --log.run_dir "$out/$name" "$@" 2>&1 \
    | grep -v "^\[20" | tail -n "${RUN_TAIL:-25}"
}
