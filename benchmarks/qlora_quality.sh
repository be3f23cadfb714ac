#!/usr/bin/env bash
# QLoRA's quality against bf16 LoRA on a base worth tuning (issue 26), on one GPU:
#   bash benchmarks/qlora_quality.sh FIXTURE OUT
# 1. pretrain a ~125M Llama shape (768 wide, 12 blocks, the fixture's 32,000-entry tokenizer) on
#    this Python's standard library text (`data.source: stdlib`) and export it as an HF folder;
# 2. fine-tune that folder on the fixture's chat data twice, the same steps, batches and seed:
#    configs/finetune-lora.yaml (bf16 base) and configs/finetune-qlora.yaml (NF4 base);
# 3. compare their held-out eval losses (each run's last `eval_loss` in metrics.jsonl).
# PRETRAIN_STEPS and TUNE_STEPS set the lengths; PRE_MB, TUNE_MB, PRE_SEQ, TUNE_SEQ the batches and
# MAX_TOKENS what is read (a CPU smoke test shrinks them). FIXTURE: benchmarks/sft_fixture.py's.
set -euo pipefail
fix=${1:?fixture folder}
out=${2:?output folder}
pre_steps=${PRETRAIN_STEPS:-1200}
tune_steps=${TUNE_STEPS:-150}
pre_mb=${PRE_MB:-32} tune_mb=${TUNE_MB:-8} pre_seq=${PRE_SEQ:-1024} tune_seq=${TUNE_SEQ:-2048}
max_tokens=${MAX_TOKENS:-null}
mkdir -p "$out/base-init"
export PYTORCH_CUDA_ALLOC_CONF=${PYTORCH_CUDA_ALLOC_CONF:-expandable_segments:True}
python3 - "$fix/model-1b" "$out/base-init" <<'PY'
import json, shutil, sys
from pathlib import Path
src, dst = Path(sys.argv[1]), Path(sys.argv[2])
for f in src.iterdir():
    if f.name != "config.json":
        shutil.copy(f, dst / f.name)
cfg = json.loads((src / "config.json").read_text())
cfg.update(hidden_size=768, intermediate_size=2048, num_hidden_layers=12, num_attention_heads=12,
           num_key_value_heads=4, head_dim=64, tie_word_embeddings=False)
(dst / "config.json").write_text(json.dumps(cfg, indent=2))
PY
cat > "$out/pretrain.yaml" <<EOF
model: {hf: $out/base-init, random_init: true, seq_len: $pre_seq}
data: {source: stdlib, format: text, val_fraction: 0.01, max_tokens: $max_tokens}
train: {steps: $pre_steps, micro_batch_size: $pre_mb, grad_accum_steps: 1, eval_every: $pre_steps}
optim: {lr: 1.0e-3, warmup_steps: 100, weight_decay: 0.1, min_lr_ratio: 0.1}
parallel: {backend: fsdp}
checkpoint: {every: 0, save_final: true, export_final: true}
log: {every: 100, run_dir: $out/pretrain}
EOF
python3 -m zerofit.cli train -c "$out/pretrain.yaml" 2>&1 | grep -v "^\[20" | tail -15
base=$(ls -d "$out"/pretrain/export/step_* | tail -1)
tune() {  # name, recipe, extra overrides
  local name=$1 recipe=$2; shift 2
  python3 -m zerofit.cli train -c "$recipe" --model.hf "$base" --data.source "$fix/chat.jsonl" \
    --model.seq_len "$tune_seq" --train.steps "$tune_steps" --train.micro_batch_size "$tune_mb" \
    --train.grad_accum_steps 1 --train.eval_every "$(( (tune_steps + 2) / 3 ))" --data.val_fraction 0.05 \
    --parallel.backend fsdp --checkpoint.every 0 --checkpoint.save_final false \
    --checkpoint.export_final false --log.every 50 --data.max_tokens "$max_tokens" --log.run_dir "$out/$name" "$@" 2>&1 |
    grep -v "^\[20" | tail -8
}
tune lora configs/finetune-lora.yaml
tune qlora configs/finetune-qlora.yaml
python3 - "$out" <<'PY'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
def evals(name):
    rows = [json.loads(l) for l in (out / name / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["eval_loss"] for r in rows if "eval_loss" in r}
pre = evals("pretrain")
lora, qlora = evals("lora"), evals("qlora")
last = max(lora)
res = {
    "pretrain_eval_loss": pre, "lora_eval_loss": lora, "qlora_eval_loss": qlora,
    "final_relative_gap": (qlora[last] - lora[last]) / lora[last],
}
(out / "quality.json").write_text(json.dumps(res, indent=1))
print(json.dumps(res))
PY
