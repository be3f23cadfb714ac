#!/usr/bin/env bash
# Create .venv with zerofit, DeepSpeed and the test tools.
# torch is pinned to 2.13.0 (a CPU build where one is on local disk, else PyPI's default build); set
# TORCH_SPEC to use another, e.g. TORCH_SPEC="torch==2.11.0". DeepSpeed is built from its source
# archive against that torch with no prebuilt ops (they JIT-compile where used). torchao (precision.fp8)
# is pinned to 0.18.0 to match; set TORCHAO_SPEC to change it.
set -euo pipefail
cd "$(dirname "$0")"
python3 -m venv .venv
pip=(.venv/bin/python -m pip install -q)
"${pip[@]}" "${TORCH_SPEC:-torch==2.13.0}" setuptools wheel
DS_BUILD_OPS=0 "${pip[@]}" --no-build-isolation "deepspeed>=0.16"
"${pip[@]}" -e ".[dev]" "${TORCHAO_SPEC:-torchao==0.18.0}"
echo "zerofit installed in $(pwd)/.venv"
