source benchmarks/device_prelude.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/gpu.txt
python3 benchmarks/sft_fixture.py /tmp/fx --shapes 8b > /dev/null
rm -rf /tmp/p
DEADLINE=${D:-560} WARMUP=2 STEPS=4 PROFILE=1 bash benchmarks/sft_h200.sh qlora-8b-host /tmp/fx /tmp/p 2>&1 | grep -v "^|.*|.*|.*|.*|.*|$" | tail -30
python3 benchmarks/bundle_results.py /tmp/p $OUT/all-results.json > /dev/null
for t in /tmp/p/*/*/profile/rank0.pt.trace.json; do n=$(echo $t | cut -d/ -f4); python3 benchmarks/trace_kernels.py $t $OUT/$n-kernels.json > /dev/null; python3 -c "import json,sys;d=json.load(open(sys.argv[1]));print(sys.argv[1].split('/')[-1],d['wall_ms'],d['device_ms_by_kind'],d['idle_gaps_ms_by_length'])" $OUT/$n-kernels.json; done
cp /tmp/p/*/results.md $OUT/ 2>/dev/null; for d in /tmp/p/*/; do cp $d/results.md $OUT/$(basename $d)-results.md 2>/dev/null; cp $d/log.txt $OUT/$(basename $d)-log.txt 2>/dev/null; done
