source benchmarks/device_prelude.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/gpu.txt
python3 -c "import inspect,torch.nn.attention.varlen as v; print(inspect.signature(v.varlen_attn))" | tee $OUT/varlen-signature.txt; python3 -c "import inspect,torch.nn.attention.varlen as v; print(inspect.getsource(v))" > $OUT/varlen-source.py.txt
python3 benchmarks/sft_fixture.py /tmp/fx --shapes 8b > /dev/null
rm -rf /tmp/p
run_stock() { DEADLINE=$((575 - SECONDS)) WARMUP=3 STEPS=4 STOCK_TAG=$1 STOCK_SPLIT="$2" STOCK_S=$3 bash benchmarks/sft_h200.sh qlora-8b-stock /tmp/fx /tmp/p 2>&1 | tail -1 | cut -c1-300; echo "stock $1 done $SECONDS"; }
run_stock 4x4-ac "train.micro_batch_size=4 train.grad_accum_steps=4 parallel.activation_checkpointing=full" 150
run_stock 1x16-noac "train.micro_batch_size=1 train.grad_accum_steps=16 parallel.activation_checkpointing=none" 150
DEADLINE=$((575 - SECONDS)) WARMUP=3 STEPS=4 KS="2 4" LIMIT_S=200 bash benchmarks/sft_h200.sh qlora-recompute /tmp/fx /tmp/p 2>&1 | grep -E "^\| 2 x 8|best" | cut -c1-300
echo "zerofit done $SECONDS"
run_stock 2x8-noac "train.micro_batch_size=2 train.grad_accum_steps=8 parallel.activation_checkpointing=none" 120
python3 benchmarks/bundle_results.py /tmp/p $OUT/all-results.json > /dev/null
for d in /tmp/p/*/; do cp $d/results.md $OUT/$(basename $d)-results.md 2>/dev/null; cp $d/log.txt $OUT/$(basename $d)-log.txt 2>/dev/null; done
echo "elapsed $SECONDS"
