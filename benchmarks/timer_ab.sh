#!/usr/bin/env bash
# DeepSpeed's throughput timer on against off (zerofit's JSON turns it off since 2026-12-07; a
# user's file can turn it on: benchmarks/ds_timer_on.json), in one device call, one process per
# variant, alternating which goes first: ZeRO-1 on the 2.9B shape at 1 x 1024 x 2, ZeRO-3 on
# the 2.1B shape at 1 x 512 x 4 (eager, bf16 states, torch's AdamW: no op to build). ONLY_ZERO1=1
# runs the first pair alone. Writes OUT/ab-zero{1,3}-results.json:
#   bash benchmarks/timer_ab.sh   (OUT: the device tool's output folder)
source benchmarks/device_prelude.sh; root=$OUT; source benchmarks/bench_lib.sh
b=(--nproc 1 --data.source stdlib --data.tokenizer byte --data.max_tokens 1000000 --train.eval_every 0 --checkpoint.save_final false --precision.mode bf16 --optim.warmup_steps 2 --log.every 1000 --model.preset llama3-1b)
z="precision.master_dtype=bf16 parallel.backend=deepspeed parallel.compile=false parallel.deepspeed.torch_adam=true train.micro_batch_size=1"
t="parallel.deepspeed.config=benchmarks/ds_timer_on.json"
s29="{dim: 2560, n_layers: 32, n_heads: 20, n_kv_heads: 4, ffn_dim: 6912}"
s21="{dim: 2304, n_layers: 26, n_heads: 18, n_kv_heads: 6, ffn_dim: 6144}"
nvidia-smi --query-gpu=name --format=csv,noheader
zf_bench ab-zero1 100 3 8 "${b[@]}" --model.overrides "$s29" --model.seq_len 1024 --variant "zero1 1x1024 x2: $z train.grad_accum_steps=2 parallel.deepspeed.stage=1" --variant "zero1 1x1024 x2 timer on: $z train.grad_accum_steps=2 parallel.deepspeed.stage=1 $t" | grep -E ": ok|: fail|rror"
[ "${ONLY_ZERO1:-0}" = 1 ] || zf_bench ab-zero3 100 3 8 "${b[@]}" --model.overrides "$s21" --model.seq_len 512 --variant "zero3 1x512 x4 timer on: $z train.grad_accum_steps=4 parallel.deepspeed.stage=3 $t" --variant "zero3 1x512 x4: $z train.grad_accum_steps=4 parallel.deepspeed.stage=3" | grep -E ": ok|: fail|rror"
for g in ab-zero1 ab-zero3; do cp $OUT/$g/results.json $OUT/$g-results.json 2>/dev/null; done
