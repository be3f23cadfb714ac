#!/usr/bin/env bash
# Create .venv with zerofit and its test tools. torch is pinned to 2.13.0 (a CPU build where one is
# on local disk, else PyPI's default build); set TORCH_SPEC to use another, e.g. TORCH_SPEC="torch==2.11.0".
set -euo pipefail
cd "$(dirname "$0")"
python3 -m venv .venv
.venv/bin/python -m pip install -q "${TORCH_SPEC:-torch==2.13.0}"
.venv/bin/python -m pip install -q -e ".[dev]"
echo "zerofit installed in $(pwd)/.venv"
