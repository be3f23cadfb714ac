"""NVMe offload (ZeRO-Infinity) on this machine, checked before any rank starts.

Two things must hold for `offload_optimizer: nvme` or `offload_param: nvme` to run:
- DeepSpeed's async_io op must build. DeepSpeed 0.19.8 JIT-compiles it at the first NVMe run
  (`op_builder/cpu/async_io.py` on the CPU accelerator, the same sources on CUDA) against
  ``libaio.h`` and links ``-laio``: its `is_compatible` compiles and links a call to `io_submit`.
  Without libaio's development files (Debian: libaio-dev) it cannot, and the run would die in
  every rank's traceback. `aio_missing` looks for what the build needs without importing torch
  or DeepSpeed: a prebuilt op in the DeepSpeed package, or the header, the link library and a
  C++ compiler.
- `parallel.deepspeed.nvme_path` must be a directory that exists (DeepSpeed would create a
  mistyped mount point on the root disk), takes files, accepts O_DIRECT (the op opens every swap
  file with it: a filesystem that refuses it fails at the first write) and has room for the
  planned swap files (`check_nvme_path`).
"""

from __future__ import annotations

import contextlib
import ctypes.util
import errno
import importlib.util
import mmap
import os
import shlex
import shutil
import sysconfig
import tempfile
from pathlib import Path

from zerofit.backends.deepspeed.options import DeepSpeedOptions
from zerofit.config.limits import shown
from zerofit.config.sizes import human_bytes
from zerofit.errors import UserError

AIO_INSTALL = "apt install libaio-dev; libaio-devel on Fedora/RHEL"
DIRECT_BLOCK = 4096  # bytes of the O_DIRECT probe write: one page, aligned as O_DIRECT needs
SWAP_FOLDER = "zero_stage_3"  # what DeepSpeed writes under nvme_path (stage3._configure_...)


def _flag_dirs(variable: str, flag: str) -> list[str]:
    """The directories a compiler flag names in an environment variable (-I in CFLAGS, ...)."""
    words = shlex.split(os.environ.get(variable, ""))
    out = [w[len(flag) :] for w in words if w.startswith(flag) and len(w) > len(flag)]
    out += [b for a, b in zip(words, words[1:], strict=False) if a == flag]
    return out


def _path_dirs(*variables: str) -> list[str]:
    return [d for v in variables for d in os.environ.get(v, "").split(os.pathsep) if d]


def _include_dirs() -> list[str]:
    return [
        "/usr/include",
        "/usr/local/include",
        *_path_dirs("CPATH", "C_INCLUDE_PATH", "CPLUS_INCLUDE_PATH"),
        *_flag_dirs("CFLAGS", "-I"),
    ]


def _library_dirs() -> list[str]:
    multiarch = sysconfig.get_config_var("MULTIARCH") or ""
    roots = ["/usr/lib", "/lib", "/usr/lib64", "/lib64", "/usr/local/lib"]
    return [
        *roots,
        *(f"{r}/{multiarch}" for r in roots if multiarch),
        *_path_dirs("LIBRARY_PATH"),
        *_flag_dirs("LDFLAGS", "-L"),
    ]


def _prebuilt_op() -> bool:
    """DeepSpeed installed with its async_io op compiled in (DS_BUILD_AIO=1)."""
    try:
        spec = importlib.util.find_spec("deepspeed")
    except (ImportError, ValueError):
        return False
    roots = list(spec.submodule_search_locations or []) if spec else []
    return any(any((Path(r) / "ops" / "aio").glob("async_io_op*.so")) for r in roots)


def aio_missing() -> str | None:
    """What the async_io op's build lacks here ("" parts joined), or None when it can build (or
    is built already). The runtime library alone (libaio1) is not enough: the build links
    ``libaio.so``, which only the development package installs."""
    if _prebuilt_op():
        return None
    lacks = []
    if not any(Path(d, "libaio.h").is_file() for d in _include_dirs()):
        lacks.append("libaio's header (libaio.h)")
    if not any(Path(d, "libaio.so").exists() for d in _library_dirs()):
        runtime = ctypes.util.find_library("aio")
        lacks.append("libaio.so" + (f" (only the runtime {runtime} is here)" if runtime else ""))
    if lacks:
        return f"{' and '.join(lacks)} missing ({AIO_INSTALL})"
    compiler = os.environ.get("CXX", "c++")
    if shutil.which(compiler) is None:
        return f"no C++ compiler ({compiler}) to build it (apt install g++)"
    return None


def check_aio(setting: str) -> None:
    """UserError naming `setting` when DeepSpeed's async_io op cannot build here."""
    why = aio_missing()
    if why:
        raise UserError(
            f"{setting} needs DeepSpeed's async_io op, which cannot build here: {why}; "
            "or offload to cpu"
        )


def _direct_io_refused(folder: Path) -> str | None:
    """Why a file in `folder` cannot be written with O_DIRECT (None when it can): one aligned
    page written through a temporary file, removed again."""
    fd, name = tempfile.mkstemp(dir=folder, prefix=".zerofit-odirect-")
    os.close(fd)
    buffer = mmap.mmap(-1, DIRECT_BLOCK)  # page-aligned, as O_DIRECT requires
    try:
        fd = os.open(name, os.O_WRONLY | os.O_DIRECT)
        try:
            os.write(fd, buffer)
        finally:
            os.close(fd)
    except OSError as e:
        return e.strerror or errno.errorcode.get(e.errno or 0, type(e).__name__)
    finally:
        buffer.close()
        with contextlib.suppress(OSError):
            os.unlink(name)
    return None


def swap_bytes_present(folder: Path) -> int:
    """Bytes of an earlier run's swap files under `folder` (DeepSpeed rewrites them in place)."""
    root = folder / SWAP_FOLDER
    if not root.is_dir():
        return 0
    total = 0
    for path in root.rglob("*"):
        with contextlib.suppress(OSError):
            total += path.stat().st_size if path.is_file() else 0
    return total


def check_nvme_path(path: str, needed: float, what: str) -> None:
    """UserError, one line, unless `path` is an existing directory that takes files, accepts
    O_DIRECT and has room for `needed` bytes (`what` says whose: ranks x bytes a rank)."""
    setting = "parallel.deepspeed.nvme_path"
    folder = Path(path).expanduser()
    name = shown(str(folder), quote=False)
    if not folder.exists():
        raise UserError(
            f"{setting}: {name} does not exist; create it on the NVMe drive first "
            "(a mistyped mount point would fill the disk it is on)"
        )
    if not folder.is_dir():
        raise UserError(f"{setting}: {name} is not a directory")
    try:
        refused = _direct_io_refused(folder)
    except OSError as e:
        why = e.strerror or type(e).__name__
        raise UserError(f"{setting}: {name} is not writable ({why})") from None
    if refused:
        raise UserError(
            f"{setting}: {name} is on a filesystem without O_DIRECT ({refused}), which DeepSpeed's "
            "async_io needs for its swap files: give a directory on a local SSD"
        )
    reusable = swap_bytes_present(folder)
    free = shutil.disk_usage(folder).free + reusable
    if needed > free:
        earlier = f", counting {human_bytes(reusable)} of earlier swap files" if reusable else ""
        raise UserError(
            f"{setting}: {name} has {human_bytes(free)} free{earlier}; NVMe offload needs "
            f"{human_bytes(needed)} there ({what})"
        )


def uncompiled_on_disk(opts: DeepSpeedOptions) -> str | None:
    """Why `parallel.compile: auto` is off with the parameters on NVMe: compiled blocks failed in
    Triton's LLVM pass ("PassManager::run failed", an RMSNorm kernel) in both such H100 runs, at
    67.8 and 33.5 GiB of host RAM, where the optimizer alone on NVMe compiled; such a step waits on
    the disk (docs/benchmarks/2026-12-06-nvme-h100.md). A written `compile: true` is kept."""
    if opts.offload_param != "nvme":
        return None
    return "the parameters are on NVMe (see docs/engines.md)"
