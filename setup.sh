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
# NVMe offload (parallel.deepspeed.offload_*: nvme) needs DeepSpeed's async_io op, built against
# DeepSpeed JIT-compiles its ops on first use (a minute or more each on 2 cores): build the ones
# zerofit's runs use here, at install time, rather than inside the first run (or test) that needs
# them. A failure is not fatal: the op then builds when first used.
if ! timeout 1800 .venv/bin/python -c "
from deepspeed.accelerator import get_accelerator
for name in ('CPUAdamBuilder', 'FusedAdamBuilder', 'ShareMemCommBuilder', 'PinMemoryBuilder'):
    builder = get_accelerator().create_op_builder(name)
    if builder is not None and builder.is_compatible(verbose=False):
        builder.load(verbose=False)
" >.venv/ds-ops-build.log 2>&1; then
    echo "note: DeepSpeed's ops did not prebuild (see .venv/ds-ops-build.log); they build on first use"
fi
# libaio's development files: installed with apt as root (ZEROFIT_NO_APT=1 skips it), the op then
# JIT-compiled once (minutes; a log in .venv/async_io-build.log). Without them everything else
# works, and setup says in one line what is missing.
aio_missing() {
    .venv/bin/python -c "from zerofit.backends.deepspeed.nvme import aio_missing as m; print(m() or '')" \
        2>/dev/null || echo "an importable zerofit (.venv/bin/python -c 'import zerofit' says why)"
}
if [ -n "$(aio_missing)" ] && [ "$(id -u)" = 0 ] && [ -z "${ZEROFIT_NO_APT:-}" ] && command -v apt-get >/dev/null; then
    { apt-get install -y -q libaio-dev || { apt-get update -q && apt-get install -y -q libaio-dev; }; } >/dev/null 2>&1 || true
fi
missing="$(aio_missing)"
if [ -n "$missing" ]; then
    echo "note: NVMe offload cannot run here: DeepSpeed's async_io op cannot build: $missing"
elif ! timeout 1200 .venv/bin/python -c "from deepspeed.ops.op_builder import AsyncIOBuilder; AsyncIOBuilder().load()" >.venv/async_io-build.log 2>&1; then
    # (a build killed midway leaves torch's lock file, on which the next build waits: the timeout)
    echo "note: NVMe offload cannot run here: DeepSpeed's async_io op did not build in 20 minutes (see .venv/async_io-build.log; a stale lock: ~/.cache/torch_extensions/*/async_io/lock)"
fi
echo "zerofit installed in $(pwd)/.venv"
