source benchmarks/device_prelude.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/gpu.txt
timeout 60 python3 -m pytest -q tests/test_gpu.py -k varlen -p no:cacheprovider > $OUT/varlen-test.txt 2>&1; rc=$?
tail -1 $OUT/varlen-test.txt | cut -c1-300
if [ $rc != 0 ]; then grep -E "Error|assert" $OUT/varlen-test.txt | head -5 | cut -c1-300; echo "varlen test FAIL: stop"; exit 0; fi
python3 benchmarks/sft_fixture.py /tmp/fx --shapes 8b > /dev/null
rm -rf /tmp/p
DEADLINE=$((420 - SECONDS)) WARMUP=3 STEPS=4 bash benchmarks/sft_h200.sh qlora-8b-stock /tmp/fx /tmp/p 2>&1 | tail -1 | cut -c1-300
cp /tmp/p/*/log.txt $OUT/stock-log.txt; echo "stock done $SECONDS"
DEADLINE=$((420 - SECONDS)) WARMUP=3 STEPS=4 KS="0 2 4" LIMIT_S=260 bash benchmarks/sft_h200.sh qlora-recompute /tmp/fx /tmp/p 2>&1 | grep -E "^\| 2 x 8|best|rror" | cut -c1-300
python3 benchmarks/bundle_results.py /tmp/p $OUT/all-results.json > /dev/null
for d in /tmp/p/*/; do cp $d/results.md $OUT/$(basename $d)-results.md 2>/dev/null; done
echo "elapsed $SECONDS"
