source benchmarks/device_prelude.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/gpu.txt
timeout 90 python3 -m pytest -q tests/test_gpu_nf4.py -p no:cacheprovider > $OUT/kernel-test.txt 2>&1; rc=$?
tail -1 $OUT/kernel-test.txt | cut -c1-300
if [ $rc != 0 ]; then echo "kernel test FAIL: stop"; exit 0; fi
python3 benchmarks/sft_fixture.py /tmp/fx --shapes 8b > /dev/null
rm -rf /tmp/p
echo "start $SECONDS"
DEADLINE=$((560 - SECONDS)) WARMUP=3 STEPS=4 bash benchmarks/sft_h200.sh qlora-8b-stock /tmp/fx /tmp/p 2>&1 | tail -1 | cut -c1-400
echo "stock done $SECONDS"
DEADLINE=$((560 - SECONDS)) WARMUP=3 STEPS=4 KS="4 8 12" LIMIT_S=420 bash benchmarks/sft_h200.sh qlora-recompute /tmp/fx /tmp/p 2>&1 | grep -vE "^\s*$" | tail -14 | cut -c1-300
python3 benchmarks/bundle_results.py /tmp/p $OUT/all-results.json > /dev/null
for d in /tmp/p/*/; do cp $d/results.md $OUT/$(basename $d)-results.md 2>/dev/null; cp $d/log.txt $OUT/$(basename $d)-log.txt 2>/dev/null; done
for f in /tmp/p/*/*/logs/*.log; do n=$(echo $f | cut -d/ -f4-5 | tr / _); tail -30 $f > $OUT/$n.tail.txt; done 2>/dev/null
echo "elapsed $SECONDS"; ls $OUT
