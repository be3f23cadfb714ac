# Shared by the H200 benchmark scripts (source it; they set $root, the output folder).

# zf_bench OUT-SUBDIR TIMEOUT WARMUP STEPS ARGS...: one `zerofit bench` group under $root, its
# progress lines without log noise or table borders, then its markdown table.
zf_bench() {
  local sub=$1 limit=$2 warmup=$3 steps=$4; shift 4
  python3 -m zerofit.cli bench --warmup "$warmup" --steps "$steps" --timeout "$limit" \
    --out "$root/$sub" "$@" 2>&1 | grep -v "^\[20" | grep -v "^[│┃┏┡└]"
  tail -n +6 "$root/$sub/results.md" 2>/dev/null
}

# zf_prebuild: DeepSpeed's fused and CPU Adam JIT-compile on first use; build them off the clock.
zf_prebuild() {
  python3 -c "from deepspeed.ops.op_builder import FusedAdamBuilder, CPUAdamBuilder; FusedAdamBuilder().load(); CPUAdamBuilder().load()" \
    > "$root/prebuild.log" 2>&1
}
