source benchmarks/device_prelude.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/gpu.txt
grep -nE "^(ROWS_PER_PROGRAM|WARPS|USE_KERNEL) =" src/zerofit/models/nf4_kernel.py src/zerofit/models/nf4.py
timeout 120 python3 -m pytest -q tests/test_gpu_nf4.py -p no:cacheprovider > $OUT/kernel-test.txt 2>&1; rc=$?
tail -2 $OUT/kernel-test.txt | cut -c1-300
if [ $rc != 0 ]; then echo "kernel test FAIL: stop"; exit 0; fi
python3 benchmarks/sft_fixture.py /tmp/fx --shapes 8b > /dev/null
rm -rf /tmp/p
DEADLINE=$((330 - SECONDS)) WARMUP=3 STEPS=5 SPLITS="2x8" LIMIT_S=135 PROFILE=1 TAG=kernel64 bash benchmarks/sft_h200.sh qlora-8b-zerofit /tmp/fx /tmp/p 2>&1 | grep -vE "^\s*$" | tail -12 | cut -c1-300
DEADLINE=$((330 - SECONDS)) WARMUP=3 STEPS=5 bash benchmarks/sft_h200.sh qlora-8b-stock /tmp/fx /tmp/p 2>&1 | tail -1 | cut -c1-400
python3 benchmarks/bundle_results.py /tmp/p $OUT/all-results.json > /dev/null
for d in /tmp/p/*/; do cp $d/results.md $OUT/$(basename $d)-results.md 2>/dev/null; cp $d/log.txt $OUT/$(basename $d)-log.txt 2>/dev/null; done
for t in /tmp/p/*/*/profile/rank0.pt.trace.json; do n=$(echo $t | cut -d/ -f4); python3 benchmarks/trace_kernels.py $t $OUT/$n-kernels.json > /dev/null; python3 -c "import json,sys;d=json.load(open(sys.argv[1]));print(d['wall_ms'],d['device_ms_by_kind']);[print(round(k['total_ms'],1),k['calls'],k['name'][:90]) for k in d['top'][:16]]" $OUT/$n-kernels.json; done
echo "elapsed $SECONDS"; ls $OUT
