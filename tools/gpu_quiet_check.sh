#!/usr/bin/env bash
# One device call: the refactored tree trains, resumes across engines and exports on the GPU, and
# none of it prints a library's warning (issue 25, item 7). Output: $OUT/quiet.tgz + a table.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export TORCH_CUDA_ARCH_LIST=9.0
w=$OUT/quiet; mkdir -p "$w"; cd "$w"
zf() { local name=$1; shift; timeout 300 python3 -m zerofit.cli "$@" > "$name.out" 2> "$name.err"; echo "$name rc=$?"; }
python3 - <<'PY'
from transformers import LlamaConfig, LlamaForCausalLM
cfg = LlamaConfig(vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)
LlamaForCausalLM(cfg).save_pretrained("hf-tiny")
PY
S="--train.steps 12 --log.every 4 --log.progress false --model.seq_len 256"
zf fsdp train --nproc 1 $S --log.run_dir fsdp
zf fsdp_fp8 train --nproc 1 $S --model.preset small --precision.fp8 tensorwise --log.run_dir fsdp_fp8
zf fsdp_fp8_rowwise train --nproc 1 $S --model.preset small --precision.fp8 rowwise --log.run_dir fsdp_fp8_r
zf ds3 train --nproc 1 $S --parallel.backend deepspeed --log.run_dir ds3
zf ds_to_fsdp train --nproc 1 $S --train.steps 16 --resume ds3/checkpoints/step_00000012 --log.run_dir ds_to_fsdp
zf fsdp_to_ds train --nproc 1 $S --train.steps 16 --parallel.backend deepspeed --resume fsdp/checkpoints/step_00000012 --log.run_dir fsdp_to_ds
zf lora train --nproc 1 $S --model.hf hf-tiny --model.lora.rank 8 --log.run_dir lora
zf export export ds_to_fsdp --out export-hf
zf export_lora export lora --out export-lora
zf plan plan --preset llama3-8b
python3 -c "import zerofit, transformers, torchao" > imports.out 2> imports.err; echo imports rc=$?
cd "$OUT" && tar czf quiet.tgz quiet && rm -rf quiet
tar xzf quiet.tgz -C /tmp && cd /tmp/quiet
echo "== noise lines per command"
for f in *.out *.err; do n=$(grep -cE '\[WARNING\]|Warning: |warnings\.warn|Failed to load |built successfully|^[WE][0-9]{4} |is deprecated' "$f"); [ "$n" != 0 ] && { echo "$f: $n"; grep -E '\[WARNING\]|Warning: |warnings\.warn|Failed to load |built successfully|^[WE][0-9]{4} |is deprecated' "$f" | head -5; }; done
echo "== first lines"; for f in *.out; do echo "-- $f"; grep -v "│\|┌\|└\|├\|━\|┏\|┃\|┗\|┡" "$f" | head -8; done
echo "== stderr tails"; for f in *.err; do [ -s "$f" ] && { echo "-- $f"; tail -5 "$f"; }; done
