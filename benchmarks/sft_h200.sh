#!/usr/bin/env bash
# Fine-tuning figures on one H200: zerofit beside transformers (+ PEFT) + FSDP2 run the usual way
# (benchmarks/stock_sft.py), on the same chat rows, masks and packing, in one device call:
#   bash benchmarks/sft_h200.sh PHASE FIXTURE OUT
#   issue 13's PHASEs: probe (1B, short) | 1b | 8b | lora | all (1b, lora, 8b, 1B at micro-batch
#   16, in that order, under DEADLINE s) | rest (all but the first 1B group); both stacks at the
#   same micro-batch, accumulation and checkpointing, stock eager without Liger Kernel.
#   issue 24's PHASEs: fast-lora | fast-1b | fast-8b: zerofit's recipe at its defaults (only the
#   model, data and benchmark switches given) beside stock + Liger Kernel, eager and per-layer
#   compiled, at the recipe's global batch (STOCK_MB sets stock's micro-batch x accumulation);
#   fast-lora also runs zerofit eager and compiled without model.lean_ops at stock's split.
#   issue 26's PHASEs: qlora-probe (1B) | qlora-8b (LIMIT GiB per GPU, default 23: a 24 GB card)
#   | qlora-70b (zerofit alone, the whole card) | qlora-ac-probe (1B) | qlora-8b-splits |
#   qlora-8b-host | qlora-8b-stock | qlora-8b-zerofit | qlora-graphs | qlora-recompute: see qlora_* below. issue 28's PHASEs: dpo-8b | dpo-8b-mem | dpo-8b-ac | dpo-8b-ac2 | dpo-1b
#   (TRL's DPOTrainer beside zerofit's DPO): see dpo_* below.
# FIXTURE is what `python benchmarks/sft_fixture.py FIXTURE` made (model-1b, model-8b, chat.jsonl).
# Each zerofit variant runs under `zerofit bench` (own processes, median step time after warm-up);
# each stock run under torchrun. Needs zerofit, peft and pydantic importable (docs/benchmarks/).
set -uo pipefail
phase=${1:?phase: probe | 1b | 8b | lora | all | rest}
fix=${2:?fixture folder}
root=${3:-sft-out}
deadline=${DEADLINE:-570}
warmup=${WARMUP:-3}
steps=${STEPS:-10}
export PYTORCH_CUDA_ALLOC_CONF=${PYTORCH_CUDA_ALLOC_CONF:-expandable_segments:True}
common="checkpoint.every=0 checkpoint.export_final=false checkpoint.save_final=false"
common="$common train.eval_every=0 data.val_fraction=0 data.source=$fix/chat.jsonl"
common="$common model.seq_len=2048 log.every=1000 model.random_init=true"

left() { echo $((deadline - SECONDS)); }
as_flags() { for kv in "$@"; do printf -- "--%s %s " "${kv%%=*}" "${kv#*=}"; done; }
zerofit() {  # out-subdir, timeout, recipe, shared k=v..., then --variant args
  local sub=$1 limit=$2 recipe=$3; shift 3
  local shared=() variants=()
  while [ $# -gt 0 ] && [ "$1" != --variant ]; do shared+=("$1"); shift; done
  variants=("$@")
  if [ "$(left)" -lt "$limit" ]; then limit=$(left); fi
  if [ "$limit" -lt 40 ]; then echo "skipped zerofit $sub: out of time"; return; fi
  # shellcheck disable=SC2046
  python3 -m zerofit.cli bench --warmup "$warmup" --steps "$steps" --timeout "$limit" \
    ${PROFILE:+--profile "$PROFILE"} --out "$root/$sub" -c "$recipe" $(as_flags $common "${shared[@]}") "${variants[@]}" 2>&1 |
    grep -v "^\[20" | grep -v "^[│┃┏┡└]" | tail -5
  tail -n +6 "$root/$sub/results.md" 2>/dev/null
}
stock() {  # out-subdir, timeout, recipe, extra args (k=v overrides, --attn)
  local sub=$1 limit=$2 recipe=$3; shift 3
  if [ "$(left)" -lt "$limit" ]; then limit=$(left); fi
  if [ "$limit" -lt 40 ]; then echo "skipped stock $sub: out of time"; return; fi
  mkdir -p "$root/$sub"
  # shellcheck disable=SC2086
  timeout "$limit" torchrun --standalone --nproc-per-node 1 benchmarks/stock_sft.py -c "$recipe" \
    --out "$root/$sub" --warmup "$warmup" --steps "$steps" $common "$@" \
    > "$root/$sub/log.txt" 2>&1 || { echo "stock $sub failed:"; grep -v "^\[20" "$root/$sub/log.txt" | tail -4 | cut -c1-300; }
  tail -1 "$root/$sub/log.txt" | cut -c1-600
}
full=configs/finetune-full.yaml
lora=configs/finetune-lora.yaml
m1="model.hf=$fix/model-1b"
m8="model.hf=$fix/model-8b"
one_b_mb="parallel.backend=fsdp train.micro_batch_size=8 train.grad_accum_steps=2 parallel.activation_checkpointing=none"
eight_b_mb="parallel.backend=fsdp train.micro_batch_size=2 train.grad_accum_steps=4 parallel.activation_checkpointing=full"
lora_mb="parallel.backend=fsdp train.micro_batch_size=4 train.grad_accum_steps=2 parallel.activation_checkpointing=none"

probe() {
  stock 1b-stock-sdpa 150 $full $m1 $one_b_mb
  stock 1b-stock-flex 150 $full $m1 $one_b_mb --attn flex_attention
  zerofit 1b-zerofit 240 $full $m1 $one_b_mb \
    --variant "eager: parallel.compile=false" --variant "compile: parallel.compile=true"
}
one_b() {
  stock 1b-stock 150 $full $m1 $one_b_mb
  zerofit 1b-zerofit 240 $full $m1 $one_b_mb \
    --variant "eager: parallel.compile=false" --variant "compile: parallel.compile=true"
}
eight_b() {
  stock 8b-stock 200 $full $m8 $eight_b_mb
  zerofit 8b-zerofit 240 $full $m8 $eight_b_mb --variant "compile: parallel.compile=true"
}
one_b_big() {  # zerofit's own best at 1B: the same 16 rows per step in one micro-batch
  zerofit 1b-zerofit-mbs16 150 $full $m1 parallel.backend=fsdp train.micro_batch_size=16 train.grad_accum_steps=1 \
    parallel.activation_checkpointing=none --variant "compile mbs16: parallel.compile=true"
}
lora_8b() {
  stock 8b-lora-stock 180 $lora $m8 $lora_mb
  zerofit 8b-lora-zerofit 240 $lora $m8 $lora_mb --variant "compile: parallel.compile=true"
}
# Issue 24: the recipe at its defaults against stock + Liger Kernel, eager and compiled.
fast() {  # name, recipe, model, stock's split (k=v ...)
  local name=$1 recipe=$2 model=$3; shift 3
  stock "$name-stock-liger" 200 "$recipe" "$model" "$@" --liger
  stock "$name-stock-liger-compile" 240 "$recipe" "$model" "$@" --liger --compile
  zerofit "$name-zerofit" 300 "$recipe" "$model" --variant "recipe defaults: log.every=1000"
}
fast_lora() {
  local split="train.micro_batch_size=4 train.grad_accum_steps=4 parallel.activation_checkpointing=none"
  fast 8b-lora $lora $m8 ${STOCK_MB:-$split}
  # shellcheck disable=SC2086
  zerofit 8b-lora-zerofit-levers 300 $lora $m8 parallel.backend=fsdp ${STOCK_MB:-$split} \
    --variant "eager, lean: parallel.compile=false" \
    --variant "compiled, not lean: parallel.compile=true model.lean_ops=false"
}
# Issue 26: QLoRA. Stock is transformers + PEFT + bitsandbytes' Linear4bit + Liger Kernel on one
# GPU (stock_sft.py --qlora), eager and per-layer compiled; zerofit runs configs/finetune-qlora.yaml.
qlora=configs/finetune-qlora.yaml
m70="model.hf=$fix/model-70b"
qlora_probe() {  # 1B, both stacks: the 4-bit paths exercised before the 8B call
  local split="train.micro_batch_size=4 train.grad_accum_steps=2 parallel.activation_checkpointing=none"
  # shellcheck disable=SC2086
  stock 1b-qlora-stock-liger 150 $qlora $m1 $split --liger --qlora
  # shellcheck disable=SC2086
  zerofit 1b-qlora-zerofit 240 $qlora $m1 $split parallel.backend=fsdp \
    --variant "compiled: parallel.compile=true" --variant "eager: parallel.compile=false"
}
qlora_8b() {  # a 24 GB card rehearsed: both stacks capped at LIMIT GiB, the recipe's global batch
  # zerofit first (its recipe at its defaults: the planner picks under the cap; and with stock's
  # full checkpointing), then stock compiled (call 2 measured it 13% ahead of stock eager;
  # STOCK_EAGER=1 runs eager too)
  local lim=${LIMIT:-23}
  local split="train.micro_batch_size=4 train.grad_accum_steps=4 parallel.activation_checkpointing=full"
  zerofit 8b-qlora-zerofit 330 $qlora $m8 "train.gpu_memory_limit=${lim}GiB" \
    --variant "recipe defaults: log.every=1000" \
    --variant "fsdp, full AC as stock: parallel.backend=fsdp parallel.activation_checkpointing=full"
  # shellcheck disable=SC2086
  stock 8b-qlora-stock-liger-compile 240 $qlora $m8 $split --liger --qlora --compile \
    --memory-limit-gib "$lim"
  if [ -n "${STOCK_EAGER:-}" ]; then
    # shellcheck disable=SC2086
    stock 8b-qlora-stock-liger 200 $qlora $m8 $split --liger --qlora --memory-limit-gib "$lim"
  fi
}
qlora_ac_probe() {  # the 8B QLoRA OOM of 2026-12-05 (call 5): does checkpointing free a QLoRA
  # block's activations on the GPU, compiled and eager, 4-bit and bf16 base? 1B, peak memory
  local split="train.micro_batch_size=4 train.grad_accum_steps=1 parallel.backend=fsdp"
  # (compiled with no AC: 19.35 GiB at this micro-batch, 2026-12-05 call 2)
  # shellcheck disable=SC2086
  zerofit 1b-qlora-ac-probe 110 $qlora $m1 $split \
    --variant "compiled, full AC: parallel.compile=true parallel.activation_checkpointing=full" \
    --variant "eager, full AC: parallel.compile=false parallel.activation_checkpointing=full" \
    --variant "compiled, full AC, bf16 base: parallel.compile=true parallel.activation_checkpointing=full model.lora.quantize=none" \
    --variant "compiled, full AC, no dropout: parallel.compile=true parallel.activation_checkpointing=full model.lora.dropout=0" \
    --variant "compiled, full AC, not lean: parallel.compile=true parallel.activation_checkpointing=full model.lean_ops=false"
}
qlora_8b_splits() {  # the split of 16 rows per step, capped at LIMIT GiB, beside stock compiled
  # (as qlora_8b runs it): which split recomputes least at the speed of its matmuls, now that a
  # LoRA layer keeps its dropout mask as bits and a LoRA down projection no input (1 x 16 and
  # 2 x 8 with the planner's checkpointing against the recipe's 4 x 4); PROFILE=2 adds each
  # zerofit run's kernel breakdown
  local lim=${LIMIT:-23} one="train.micro_batch_size=1 train.grad_accum_steps=16"
  local two="train.micro_batch_size=2 train.grad_accum_steps=8"
  zerofit 8b-qlora-splits 125 $qlora $m8 "train.gpu_memory_limit=${lim}GiB" \
    --variant "ddp 1 x 16, no AC: parallel.backend=ddp $one parallel.activation_checkpointing=none" \
    --variant "2 x 8, planner's choice: $two" \
    --variant "recipe defaults (4 x 4): log.every=1000"
  qlora_8b_stock
}
qlora_8b_stock() {  # the stock anchor of qlora-8b-host alone: compiled, with Liger, 4 x 4, full AC;
  # STOCK_SPLIT (k=v overrides) and STOCK_TAG (the out-subdir's suffix) run another split, e.g.
  # 1 x 16 without recomputation
  local lim=${LIMIT:-23}
  local split=${STOCK_SPLIT:-train.micro_batch_size=4 train.grad_accum_steps=4 parallel.activation_checkpointing=full}
  # shellcheck disable=SC2086
  stock "8b-qlora-stock-liger-compile${STOCK_TAG:+-$STOCK_TAG}" "${STOCK_S:-200}" $qlora $m8 $split \
    --liger --qlora --compile --memory-limit-gib "$lim"
}
qlora_8b_host() {  # after the host-time cuts (documents' bounds on the host, the 4-bit rebuild
  # in one kernel): stock compiled first (the call's anchor), then zerofit's splits of 16 rows
  qlora_8b_stock
  qlora_8b_zerofit
}
qlora_8b_zerofit() {  # zerofit's splits of qlora-8b-host alone: SPLITS (default "1x16 2x8"),
  # each bench named SHAPE-qlora-host-SPLIT (with TAG set: -TAG after it), LIMIT_S s at most
  # (default 190); PROFILE=N profiles them; QMODEL=1b runs the 1B shape instead of the 8B
  local lim=${LIMIT:-23} split variant shape=${QMODEL:-8b} m=$m8
  [ "$shape" = 1b ] && m=$m1
  for split in ${SPLITS:-1x16 2x8}; do
    case $split in
    1x16) variant="ddp 1 x 16, no AC: parallel.backend=ddp train.micro_batch_size=1 train.grad_accum_steps=16 parallel.activation_checkpointing=none" ;;
    2x8) variant="2 x 8, planner's choice: train.micro_batch_size=2 train.grad_accum_steps=8" ;;
    *) echo "unknown split $split"; continue ;;
    esac
    # one bench per split: each writes its results.json before the next starts
    zerofit "$shape-qlora-host-$split${TAG:+-$TAG}" "${LIMIT_S:-190}" $qlora $m \
      "train.gpu_memory_limit=${lim}GiB" --variant "$variant"
  done
}
qlora_graphs() {  # each split of SPLITS as qlora-8b-zerofit runs it, then again with Inductor's
  # CUDA graphs on every compiled graph (TORCHINDUCTOR_CUDAGRAPHS=1, as mode="reduce-overhead"),
  # named -graphs. On an H100 on 2026-12-07 the graphs run failed at its first backward (likely a
  # layer's saved output overwritten by the next layer's replay of the shared graph):
  # docs/benchmarks/2026-12-07-qlora-rebuild-h100.md
  qlora_8b_zerofit
  TORCHINDUCTOR_CUDAGRAPHS=1 TAG=graphs PROFILE='' qlora_8b_zerofit
}
# Issue 28: DPO. Stock is TRL's DPOTrainer (benchmarks/stock_dpo.py) on the fixture's pairs.jsonl,
# with PEFT for LoRA, eager and with Liger Kernel; zerofit runs configs/dpo-lora.yaml (8B LoRA)
# and the same without adapters (1B full DPO: its reference precomputed over data.max_tokens).
dpo_stock() {  # out-subdir, timeout, stock_dpo.py args
  local sub=$1 limit=$2; shift 2
  if [ "$(left)" -lt "$limit" ]; then limit=$(left); fi
  if [ "$limit" -lt 40 ]; then echo "skipped stock $sub: out of time"; return; fi
  mkdir -p "$root/$sub"
  timeout "$limit" python3 benchmarks/stock_dpo.py --pairs "$fix/pairs.jsonl" --out "$root/$sub" \
    --warmup "$warmup" --steps "$steps" "$@" > "$root/$sub/log.txt" 2>&1 ||
    { echo "stock $sub failed:"; tail -4 "$root/$sub/log.txt" | cut -c1-300; }
  tail -1 "$root/$sub/log.txt" | cut -c1-600
}
dpo=configs/dpo-lora.yaml
dpo_pairs="data.source=$fix/pairs.jsonl model.seq_len=2048"
dpo_8b() {  # 8B LoRA DPO, 4 pairs x 2 per step, both stacks
  dpo_stock 8b-dpo-trl 170 --model "$fix/model-8b" --lora 16 --micro 4 --accum 2 --gc
  dpo_stock 8b-dpo-trl-liger 170 --model "$fix/model-8b" --lora 16 --micro 4 --accum 2 --gc --liger
  # shellcheck disable=SC2086
  zerofit 8b-dpo-zerofit 220 $dpo $m8 $dpo_pairs train.steps=100 train.epochs=null \
    --variant "recipe, 2 pairs x 4: train.micro_batch_size=2 train.grad_accum_steps=4"
}
dpo_8b_mem() {  # 8B LoRA DPO at matched memory: TRL + Liger without recomputation; zerofit
  # recomputing every block, and planned for TRL's checkpointed peak (a 20 GiB limit)
  dpo_stock 8b-dpo-trl-liger-nogc 170 --model "$fix/model-8b" --lora 16 --micro 4 --accum 2 --liger
  # shellcheck disable=SC2086
  zerofit 8b-dpo-zerofit-mem 300 $dpo $m8 $dpo_pairs train.steps=100 train.epochs=null \
    --variant "full AC, 2 pairs x 4: train.micro_batch_size=2 train.grad_accum_steps=4 parallel.activation_checkpointing=full" \
    --variant "planned for 20 GiB, 2 pairs x 4: train.micro_batch_size=2 train.grad_accum_steps=4 train.gpu_memory_limit=20GiB"
}
dpo_8b_ac() {  # 8B LoRA DPO, both stacks recomputing every block (TRL's gradient checkpointing,
  # zerofit's full AC, kept by backend auto since 2026-12-06; and DDP, whose single-GPU copy needs
  # no FSDP all-gather buffers), the same call so that the ratios divide its medians
  dpo_stock 8b-dpo-trl-liger 170 --model "$fix/model-8b" --lora 16 --micro 4 --accum 2 --gc --liger
  # shellcheck disable=SC2086
  zerofit 8b-dpo-zerofit-ac 340 $dpo $m8 $dpo_pairs train.steps=100 train.epochs=null \
    --variant "auto + full AC, 2 pairs x 4: train.micro_batch_size=2 train.grad_accum_steps=4 parallel.activation_checkpointing=full" \
    --variant "DDP + full AC, 2 pairs x 4: train.micro_batch_size=2 train.grad_accum_steps=4 parallel.backend=ddp parallel.activation_checkpointing=full" \
    --variant "DDP + full AC, 4 pairs x 2: train.micro_batch_size=4 train.grad_accum_steps=2 parallel.backend=ddp parallel.activation_checkpointing=full"
}
dpo_8b_ac2() {  # as dpo_8b_ac, once `auto` kept the written AC through the launcher too (before
  # 2026-12-06's fix, `~` expansion dropped the written keys and auto ran FSDP without AC); and at
  # one pair a micro-batch, for the memory of TRL's run
  dpo_stock 8b-dpo-trl-liger 170 --model "$fix/model-8b" --lora 16 --micro 4 --accum 2 --gc --liger
  # shellcheck disable=SC2086
  zerofit 8b-dpo-zerofit-ac2 340 $dpo $m8 $dpo_pairs train.steps=100 train.epochs=null \
    --variant "auto + full AC, 2 pairs x 4: train.micro_batch_size=2 train.grad_accum_steps=4 parallel.activation_checkpointing=full" \
    --variant "auto + full AC, 1 pair x 8: train.micro_batch_size=1 train.grad_accum_steps=8 parallel.activation_checkpointing=full" \
    --variant "DDP + full AC, 1 pair x 8: train.micro_batch_size=1 train.grad_accum_steps=8 parallel.backend=ddp parallel.activation_checkpointing=full"
}
dpo_1b() {  # 1B full DPO; zerofit's reference precomputed over the first 2M tokens of pairs
  dpo_stock 1b-dpo-trl 200 --model "$fix/model-1b" --micro 4 --accum 2
  # shellcheck disable=SC2086
  zerofit 1b-dpo-zerofit 300 $dpo $m1 $dpo_pairs model.lora.rank=0 optim.lr=5e-7 \
    data.max_tokens=2000000 train.steps=100 train.epochs=null \
    --variant "full, 2 pairs x 4: train.micro_batch_size=2 train.grad_accum_steps=4"
}
qlora_recompute() {  # issue 26's lever after the kernel (docs/benchmarks/2026-12-07-qlora-kernel-h100.md):
  # 8B 2 x 8 under the LIMIT GiB cap recomputing the first k blocks (0: none) for each k of KS (default
  # "4 8 12"; the planner picked 12, forecasting 18.58 GiB for a 17.09 GiB peak): step time and
  # peak memory per k, for the planner's forecast beside them. PEAK=GiB adds k=12 capped at that
  # (below its peak): its OOM snapshot (oom_snapshot_rank0.pickle, read by benchmarks/oom_top.py)
  # shows what is live at the peak
  local lim=${LIMIT:-23} k variants=()
  local two="parallel.backend=ddp train.micro_batch_size=2 train.grad_accum_steps=8"
  for k in ${KS:-4 8 12}; do
    if [ "$k" = 0 ]; then
      variants+=(--variant "2 x 8, no AC: $two parallel.activation_checkpointing=none")
    else
      variants+=(--variant "2 x 8, first $k: $two parallel.activation_checkpointing=first_k parallel.ac_blocks=$k")
    fi
  done
  if [ -n "${PEAK:-}" ]; then
    variants+=(--variant "2 x 8, first 12 at $PEAK GiB: $two parallel.activation_checkpointing=first_k parallel.ac_blocks=12 train.gpu_memory_limit=${PEAK}GiB")
  fi
  zerofit 8b-qlora-recompute "${LIMIT_S:-400}" $qlora $m8 "train.gpu_memory_limit=${lim}GiB" "${variants[@]}"
}
qlora_70b() {  # the whole card; fewer rows per step than the recipe (device time)
  zerofit 70b-qlora-zerofit 540 $qlora $m70 train.micro_batch_size=4 train.grad_accum_steps=1 \
    --variant "recipe defaults at 4 x 1: log.every=1000"
}
mkdir -p "$root"
case $phase in
qlora-probe) qlora_probe ;;
qlora-8b) qlora_8b ;;
qlora-70b) qlora_70b ;;
qlora-8b-splits) qlora_8b_splits ;;
qlora-8b-host) qlora_8b_host ;;
qlora-8b-stock) qlora_8b_stock ;;
qlora-8b-zerofit) qlora_8b_zerofit ;;
qlora-graphs) qlora_graphs ;;
qlora-recompute) qlora_recompute ;;
dpo-8b) dpo_8b ;;
dpo-8b-mem) dpo_8b_mem ;;
dpo-8b-ac) dpo_8b_ac ;;
dpo-8b-ac2) dpo_8b_ac2 ;;
dpo-1b) dpo_1b ;;
qlora-ac-probe) qlora_ac_probe ;;
fast-lora) fast_lora ;;
fast-1b) fast 1b $full $m1 ${STOCK_MB:-train.micro_batch_size=8 train.grad_accum_steps=2 parallel.activation_checkpointing=none} ;;
fast-8b) fast 8b $full $m8 ${STOCK_MB:-train.micro_batch_size=2 train.grad_accum_steps=8 parallel.activation_checkpointing=full} ;;
probe) probe ;;
1b) one_b ;;
8b) eight_b ;;
lora) lora_8b ;;
all) one_b; lora_8b; eight_b; one_b_big ;;
rest) lora_8b; eight_b; one_b_big ;;
*) echo "unknown phase $phase"; exit 2 ;;
esac
for log in "$root"/*/logs/*.log; do
  [ -f "$log" ] || continue
  grep -qE "^(error|Traceback)|Error" "$log" && { echo "== $log"; grep -v "^\[20" "$log" | grep -E "Error|error|Killed|memory" | tail -4 | cut -c1-400; }
done
# Every group's results.json in one file too (a device call may return only a few files).
python3 - "$root" <<'PY'
import json, pathlib, sys
root = pathlib.Path(sys.argv[1])
groups = {p.parent.name: json.loads(p.read_text()) for p in sorted(root.glob("*/results.json"))}
(root / "all-results.json").write_text(json.dumps(groups, indent=1))
PY
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import torch, transformers, peft; print('torch', torch.__version__, 'transformers', transformers.__version__, 'peft', peft.__version__)"
