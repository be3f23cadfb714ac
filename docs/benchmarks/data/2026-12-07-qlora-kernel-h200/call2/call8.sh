source benchmarks/device_prelude.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/gpu.txt
timeout 90 python3 -m pytest -q tests/test_gpu_nf4.py -p no:cacheprovider > $OUT/kernel-test.txt 2>&1; rc=$?
grep -E "passed|failed|Error|assert" $OUT/kernel-test.txt | head -8 | cut -c1-300
if [ $rc != 0 ]; then echo "kernel test FAIL: stop"; exit 0; fi
sed -i 's/^USE_KERNEL = False/USE_KERNEL = True/' src/zerofit/models/nf4.py; grep -n "^USE_KERNEL" src/zerofit/models/nf4.py
python3 benchmarks/sft_fixture.py /tmp/fx --shapes 8b > /dev/null
rm -rf /tmp/p
DEADLINE=$((390 - SECONDS)) WARMUP=2 STEPS=3 SPLITS="2x8" LIMIT_S=150 TAG=kernel bash benchmarks/sft_h200.sh qlora-8b-zerofit /tmp/fx /tmp/p 2>&1 | grep -vE "^\s*$" | tail -8 | cut -c1-400
DEADLINE=$((400 - SECONDS)) WARMUP=2 STEPS=3 bash benchmarks/sft_h200.sh qlora-8b-stock /tmp/fx /tmp/p 2>&1 | tail -3 | cut -c1-300
python3 benchmarks/bundle_results.py /tmp/p $OUT/all-results.json > /dev/null
for d in /tmp/p/*/; do cp $d/results.md $OUT/$(basename $d)-results.md 2>/dev/null; cp $d/log.txt $OUT/$(basename $d)-log.txt 2>/dev/null; done; ls $OUT
