#!/usr/bin/env bash
# Build .dpo/, the carry for issue 28's device calls (sft_h200.sh dpo-*): the GPU machine has no
# network and no trl, and a call carries at most 64 MiB, which TRL's dependencies pass (pyarrow's
# wheel alone is 53 MB). So: TRL and what it needs beyond the machine's packages, for its Python
# (3.12), installed into a folder, pyarrow's Flight, S3/GCS/Azure/HDFS/ORC libraries, headers and
# tests removed (datasets uses none of them), packed with xz (~31 MB); the fixture's models,
# tokenizer and pairs (no chat.jsonl); the wheels zerofit and the stock run need (.whl's pydantic,
# peft, liger-kernel). Run on this machine after benchmarks/sft_fixture.py bench-fixture:
#   bash benchmarks/dpo_carry.sh [bench-fixture] [.whl]
# then, on the device (carry [".dpo"]):
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .dpo/whl/*.whl
#   mkdir -p /tmp/dposite && tar -xJf .dpo/site.txz -C /tmp/dposite
#   export PYTHONPATH=/tmp/site:/tmp/dposite:$PWD/src  (+ the prelude's NCCL variables)
#   bash benchmarks/sft_h200.sh dpo-8b .dpo/fix OUT
set -euo pipefail
fix=${1:-bench-fixture}
wheels=${2:-.whl}
py=${DPO_PYTHON:-3.12}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 -m pip install -q --no-deps --no-compile --only-binary=:all: --python-version "$py" \
  --platform manylinux_2_28_x86_64 --target "$work/site" \
  trl==1.16.0 datasets==5.2.0 pyarrow==26.0.1 pandas==3.1.1 dill==0.4.1 multiprocess==0.70.19 \
  xxhash==4.1.0 "fsspec<=2026.9.0"
cd "$work/site/pyarrow"
rm -rf libarrow_flight* libarrow_python_flight* _flight* libarrow_s3* _s3fs* _azurefs* _gcsfs* \
  _hdfs* _orc* _dataset_orc* include tests src _pyarrow_cpp_tests* libarrow_python.so \
  libarrow_python.so.*.*.* libarrow_python_parquet_encryption.so \
  libarrow_python_parquet_encryption.so.*.*.*
cd - > /dev/null
find "$work/site" -name "*.pyi" -delete
find "$work/site" -name tests -type d -prune -exec rm -rf {} +
rm -rf .dpo && mkdir -p .dpo/fix .dpo/whl
tar -cJf .dpo/site.txz -C "$work/site" .
cp -r "$fix"/model-1b "$fix"/model-8b "$fix"/tokenizer "$fix"/pairs.jsonl "$fix"/fixture.json .dpo/fix/
for w in annotated hjson liger peft pydantic typing; do cp "$wheels"/"$w"*.whl .dpo/whl/; done
du -sh .dpo
