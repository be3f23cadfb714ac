source benchmarks/device_prelude.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/gpu.txt
timeout 120 python3 -m pytest -q tests/test_gpu_nf4.py -p no:cacheprovider > $OUT/kernel-test.txt 2>&1; rc=$?
tail -8 $OUT/kernel-test.txt | cut -c1-400
if [ $rc != 0 ]; then echo "kernel test FAIL: stop"; exit 0; fi
timeout 90 python3 benchmarks/nf4_formats.py $OUT/formats.json > $OUT/formats.txt 2>&1; tail -11 $OUT/formats.txt | cut -c1-200
best=$(python3 -c "import json;r=[x for x in json.load(open('$OUT/formats.json'))['kernel_sweep'] if x['same']][0];print(r['rows'],r['warps'])" 2>/dev/null)
if [ -n "$best" ]; then set -- $best; sed -i "s/^ROWS_PER_PROGRAM = [0-9]*/ROWS_PER_PROGRAM = $1/; s/^WARPS = [0-9]*/WARPS = $2/" src/zerofit/models/nf4_kernel.py; fi
grep -nE "^(ROWS_PER_PROGRAM|WARPS) =" src/zerofit/models/nf4_kernel.py
python3 benchmarks/sft_fixture.py /tmp/fx --shapes 8b > /dev/null
rm -rf /tmp/p
sed -i 's/^USE_KERNEL = False/USE_KERNEL = True/' src/zerofit/models/nf4.py; grep -n "^USE_KERNEL" src/zerofit/models/nf4.py
DEADLINE=$((560 - SECONDS)) WARMUP=3 STEPS=4 SPLITS="2x8" LIMIT_S=150 TAG=kernel bash benchmarks/sft_h200.sh qlora-8b-zerofit /tmp/fx /tmp/p 2>&1 | grep -vE "^\s*$" | tail -6 | cut -c1-300
DEADLINE=$((560 - SECONDS)) WARMUP=3 STEPS=4 bash benchmarks/sft_h200.sh qlora-8b-stock /tmp/fx /tmp/p 2>&1 | tail -3 | cut -c1-400
sed -i 's/^USE_KERNEL = True/USE_KERNEL = False/' src/zerofit/models/nf4.py; grep -n "^USE_KERNEL" src/zerofit/models/nf4.py
DEADLINE=$((560 - SECONDS)) WARMUP=3 STEPS=4 SPLITS="2x8" LIMIT_S=150 TAG=torchops bash benchmarks/sft_h200.sh qlora-8b-zerofit /tmp/fx /tmp/p 2>&1 | grep -vE "^\s*$" | tail -6 | cut -c1-300
python3 benchmarks/bundle_results.py /tmp/p $OUT/all-results.json > /dev/null
for d in /tmp/p/*/; do cp $d/results.md $OUT/$(basename $d)-results.md 2>/dev/null; cp $d/log.txt $OUT/$(basename $d)-log.txt 2>/dev/null; done
echo "elapsed $SECONDS"; ls $OUT
