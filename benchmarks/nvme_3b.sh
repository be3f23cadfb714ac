#!/usr/bin/env bash
# Issue 31's device run: a 3B-class full fine-tune (Llama-3.2-3B's widths: hidden 3072, 24 heads,
# 8 KV heads, FFN 8192, 128k vocabulary; 24 layers with untied embeddings, 3.2B parameters, as
# many as its 28 with tied ones) on one GPU, ZeRO-3 with
#   cpu:        the optimizer in host RAM (offload_optimizer: cpu), the baseline;
#   nvme_optim: the optimizer on NVMe (offload_optimizer: nvme);
#   nvme_both:  optimizer and parameters on NVMe (+ offload_param: nvme);
# each with tokens/s, peak GPU memory, the peak host RSS of all its processes at once and the disk
# bytes read and written per step (/proc/PID/io of the process tree: benchmarks/nvme_run.py),
# beside the planner's forecast of the same run (zerofit plan --json, with the disk's bandwidth
# probed in NVME_DIR: 256 MiB written and read back with O_DIRECT).
# Results: OUT/<variant>.json, OUT/plan-<variant>.json, OUT/results.json (all of them).
#
# Usage (repo root, GPU machine):
#   source benchmarks/device_prelude.sh && bash benchmarks/nvme_3b.sh OUT [NVME_DIR] [VARIANT...]
# NVME_DIR: default OUT/nvme, on the machine's local disk. The swap files take 16 bytes a parameter
# for the optimizer (fp32 master, two moments, gradient) and 2 more for the parameters: ~58 GB at
# 24 layers; zerofit refuses a disk without room before any rank starts (that line is recorded).
# LAYERS=N shortens the model for a smaller disk. STEPS (default 8), WARMUP (default 3: the steps
# left out of the bytes per step), MICRO (default 4) x ACCUM (default 2) sequences of SEQ (2048).
# One variant a device call keeps each under 10 minutes: an NVMe step moves ~100 GB.
# libaio: where DeepSpeed's async_io op cannot build and .libaio/*.deb are carried (apt-get
# download libaio1 libaio-dev, on a machine that reaches Debian's packages), they are unpacked into
# /tmp/libaio and put on CPATH / LIBRARY_PATH / LD_LIBRARY_PATH.
set -uo pipefail
out=${1:?usage: bash benchmarks/nvme_3b.sh OUT [NVME_DIR] [VARIANT...]}
shift
nvme=${1:-$out/nvme}
[ $# -gt 0 ] && shift
variants=("$@")
[ ${#variants[@]} -gt 0 ] || variants=(cpu nvme_optim nvme_both)
mkdir -p "$out" "$nvme"
py=${PYTHON:-python3}

aio_missing() { "$py" -c "from zerofit.backends.deepspeed.nvme import aio_missing as m; print(m() or '')"; }
if [ -n "$(aio_missing)" ] && ls .libaio/*.deb >/dev/null 2>&1; then
  for deb in .libaio/*.deb; do dpkg -x "$deb" /tmp/libaio; done
  lib=/tmp/libaio/usr/lib/x86_64-linux-gnu
  ln -sf libaio.so.1 "$lib/libaio.so" 2>/dev/null
  export CPATH=/tmp/libaio/usr/include${CPATH:+:$CPATH}
  export LIBRARY_PATH=$lib${LIBRARY_PATH:+:$LIBRARY_PATH} LD_LIBRARY_PATH=$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
echo "async_io: $(aio_missing | sed 's/^$/can build here/')"
# built off the clock (JIT, once; its log beside the results)
if ! "$py" -c "from deepspeed.ops.op_builder import AsyncIOBuilder; AsyncIOBuilder().load()" > "$out/async_io-build.log" 2>&1; then
  echo "async_io did not build: the tail of $out/async_io-build.log"; tail -3 "$out/async_io-build.log"
fi

layers=${LAYERS:-24} steps=${STEPS:-8} micro=${MICRO:-4} accum=${ACCUM:-2} seq=${SEQ:-2048}
model=(--model.preset llama3-1b --model.seq_len "$seq"
       --model.overrides "{dim: 3072, n_layers: $layers, n_heads: 24, n_kv_heads: 8, ffn_dim: 8192}")
common=("${model[@]}" --train.micro_batch_size "$micro" --train.grad_accum_steps "$accum"
        --precision.mode bf16 --parallel.backend deepspeed --parallel.deepspeed.stage 3
        --parallel.activation_checkpointing full)
# NVMe variants at the sub-groups zerofit's planner proposes for NVMe (FINE_SUB_GROUP_SIZE): with
# the parameters on the disk, each of DeepSpeed's pinned parameter buffers must hold the largest
# sub-group (21 x 1e9 elements = 42 GB of host RAM at DeepSpeed's default). SUB_GROUP=1000000000:
# the 2026-12-06 runs.
fine="--parallel.deepspeed.sub_group_size ${SUB_GROUP:-100000000}"
args_of() {  # variant -> its own flags
  case $1 in
    cpu) echo --parallel.deepspeed.offload_optimizer cpu ;;
    nvme_optim) echo --parallel.deepspeed.offload_optimizer nvme --parallel.deepspeed.nvme_path "$nvme" $fine ;;
    # nvme_both uncompiled: compiled blocks failed twice on the H100 in Triton's LLVM pass
    # ("PassManager::run failed", RMSNorm) with the parameters on NVMe (data/2026-12-06-nvme-h100/both2,
    # both3); zerofit's compile auto is off there too, written here so that the plan forecasts it
    nvme_both) echo --parallel.deepspeed.offload_optimizer nvme --parallel.deepspeed.offload_param nvme --parallel.deepspeed.nvme_path "$nvme" $fine ${BOTH_COMPILE:---parallel.compile false} ;;
    *) echo "unknown variant $1" >&2; return 1 ;;
  esac
}

for v in "${variants[@]}"; do
  read -r -a own <<< "$(args_of "$v")" || continue
  rm -rf "${nvme:?}/zero_stage_3"  # an earlier variant's swap files
  "$py" -m zerofit.cli plan "${common[@]}" "${own[@]}" --gpus 1 --nvme-probe "$nvme" --json \
    > "$out/plan-$v.json" 2> "$out/plan-$v.err" || tail -2 "$out/plan-$v.err"
  echo "=== $v: ${own[*]}"
  "$py" benchmarks/nvme_run.py "$out/$v.json" "${WARMUP:-3}" -- "${common[@]}" "${own[@]}" \
    --train.steps "$steps" --log.every 1 --log.progress false --checkpoint.every 0 \
    --checkpoint.save_final false --log.run_dir "$out/run-$v" || tail -5 "$out/run-$v"/*.log 2>/dev/null
  du -sb "$nvme/zero_stage_3" 2>/dev/null | sed "s/^/swap files after $v: /"
done

"$py" - "$out" <<'EOF'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
res = {}
for f in sorted(out.glob("*.json")):
    if f.name == "results.json" or f.name.startswith("plan-"):
        continue
    run = json.loads(f.read_text())
    run.pop("io_marks", None)
    plan_file = out / f"plan-{f.stem}.json"
    plan = json.loads(plan_file.read_text()) if plan_file.exists() and plan_file.stat().st_size else {}
    configured = (plan.get("as_configured") or {})
    res[f.stem] = {"measured": run, "forecast": configured, "disk": plan.get("nvme"),
                   "hardware": plan.get("hardware")}
(out / "results.json").write_text(json.dumps(res, indent=1))
print(f"wrote {out / 'results.json'}: {', '.join(res)}")
EOF
