"""Shared helpers: run `zerofit train` as a real user would (a subprocess that starts its workers)."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import yaml

from zerofit.faults.signals import parent_of

if TYPE_CHECKING:
    import torch

# Small enough for 2 CPU cores, big enough to exercise every code path.
TINY = {
    "model": {"preset": "tiny", "seq_len": 64, "overrides": {"n_layers": 2}},
    "data": {"max_tokens": 300_000},
    "train": {"steps": 10, "micro_batch_size": 4, "grad_accum_steps": 1, "eval_every": 0},
    "optim": {"lr": 3e-3, "warmup_steps": 2},
    "precision": {"mode": "fp32"},
    "log": {"every": 1, "progress": False},
}


def deep_update(base: dict, extra: dict) -> dict:
    out = json.loads(json.dumps(base))
    for k, v in extra.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict) and k != "overrides":
            out[k] = deep_update(out[k], v)
        else:
            out[k] = v
    return out


def write_config(path: Path, extra: dict | None = None) -> Path:
    path.write_text(yaml.safe_dump(deep_update(TINY, extra or {})))
    return path


def zerofit(
    *args: str, cwd: Path, timeout: int = 900, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """`zerofit ARGS` in a subprocess, with ``env`` added to this one's.

    ``timeout`` is a hang guard (a launch takes 5-40 s).
    """
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    src = str(Path(__file__).resolve().parents[1] / "src")
    env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.run(
        [sys.executable, "-m", "zerofit.cli", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit for bit the same tensor (dtype, shape and bytes): ``torch.equal`` is False for NaN,
    and a QLoRA base's NF4 words are bytes that often read as NaN in bf16."""
    import torch  # here: the conftest stays torch-free for the pure-logic tests

    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    flat = [t.clone(memory_format=torch.contiguous_format).reshape(-1) for t in (a, b)]
    return torch.equal(flat[0].view(torch.uint8), flat[1].view(torch.uint8))


def nf4_layer(weight: torch.Tensor):  # noqa: ANN201  (a zerofit.models.nf4.NF4Weight)
    """A frozen 4-bit weight holding `weight` quantised, on `weight`'s device."""
    from zerofit.models.nf4 import NF4Weight, quantize  # here: the conftest stays torch-free

    store = NF4Weight(tuple(weight.shape), device=weight.device)
    for name, value in quantize(weight).items():
        getattr(store, name).data.copy_(value)
    return store


def losses(run_dir: Path) -> dict[int, float]:
    out = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        rec = json.loads(line)
        if "loss" in rec:
            out[rec["step"]] = rec["loss"]
    return out


def train_run(
    tmp: Path, name: str, extra: dict | None = None, *args: str, keep_output: bool = False
) -> Path:
    """Train with TINY + extra in tmp/name; assert success; return the run dir. ``keep_output``:
    the launch's stdout and stderr are kept beside it, in tmp/name.stdout and tmp/name.stderr."""
    run_dir = tmp / name
    cfg = write_config(
        tmp / f"{name}.yaml", deep_update({"log": {"run_dir": str(run_dir)}}, extra or {})
    )
    proc = zerofit("train", "-c", str(cfg), *args, cwd=tmp)
    if keep_output:
        (tmp / f"{name}.stdout").write_text(proc.stdout)
        (tmp / f"{name}.stderr").write_text(proc.stderr)
    assert proc.returncode == 0, f"{name} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    return run_dir


def fixture_run(
    fixture: tuple[Path, dict], name: str, nproc: str, extra: dict, *args: str
) -> tuple[Path, str]:
    """Train ``fixture``'s base config (its folder, config beside TINY) + ``extra`` in
    folder/name on ``nproc`` processes; assert success; return the run dir and the output.

    Every run uses one CPU thread per process, so the kernels of one process and of two sum in the
    same order (the launcher would give a lone process every core).
    """
    root, base = fixture
    run_dir = root / name
    cfg = deep_update(deep_update(base, extra), {"log": {"run_dir": str(run_dir)}})
    proc = zerofit(
        "train", "-c", str(write_config(root / f"{name}.yaml", cfg)), "--nproc", nproc, *args,
        cwd=root, env={"OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    assert proc.returncode == 0, f"{name}:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    return run_dir, proc.stdout


def assert_resume_exact(tmp: Path, full: Path, extra: dict, nproc: int = 2) -> Path:
    """``full`` trained 10 steps of TINY + extra with a checkpoint at step 5 (a shared run, or one
    of the test's own); resume a copy of its step-5 checkpoint in tmp/cut, as if the run had died
    at step 7: steps 6-10 must log bitwise-equal losses. Returns the cut run's directory."""
    import shutil

    cut = tmp / "cut"
    shutil.copytree(full / "checkpoints" / "step_00000005", cut / "checkpoints" / "step_00000005")
    cfg = write_config(tmp / "cut.yaml", deep_update(extra, {"log": {"run_dir": str(cut)}}))
    proc = zerofit("train", "-c", str(cfg), "--nproc", str(nproc), "--resume", cwd=tmp)
    assert proc.returncode == 0, proc.stderr[-4000:]
    before, after = losses(full), losses(cut)
    assert sorted(after) == [6, 7, 8, 9, 10]
    assert all(after[s] == before[s] for s in after), {s: (before[s], after[s]) for s in after}
    return cut


# Runs that several test files read alike: TINY (10 steps) + a layout, with a checkpoint at steps 5
# and 10 (resume tests cut at step 5), global batch 8 (micro-batch 4 on 2 ranks, or accumulation
# on 1). Each is trained once per session, by the first test that asks for it (`shared_run`); a
# test that writes into one copies it first. Process start-up (torch, gloo, DeepSpeed) is most of a
# run's time on CPU, so sharing runs is what keeps the suite short.
CKPT5 = {"checkpoint": {"every": 5}}
_ZERO = {"parallel": {"backend": "deepspeed"}}
SHARED: dict[str, tuple[dict, int]] = {
    "fsdp@2": ({"parallel": {"backend": "fsdp", "fsdp": {"reshard_after_forward": True}}}, 2),
    "fsdp-hybrid@2": ({"parallel": {"backend": "fsdp", "fsdp": {"replicate_degree": 2}}}, 2),
    "fsdp-bf16@2": ({"parallel": {"backend": "fsdp"}, "precision": {"mode": "bf16"}}, 2),
    "ddp@2": ({"parallel": {"backend": "ddp"}}, 2),
    "ddp@1": ({"parallel": {"backend": "ddp"}, "train": {"grad_accum_steps": 2}}, 1),
    "zero1@2": (deep_update(_ZERO, {"parallel": {"deepspeed": {"stage": 1}}}), 2),
    "zero2@2": (deep_update(_ZERO, {"parallel": {"deepspeed": {"stage": 2}}}), 2),
    "zero3@2": (deep_update(_ZERO, {"parallel": {"deepspeed": {"stage": 3}}}), 2),
    "zero3-offload@2": (
        deep_update(
            _ZERO,
            {
                "parallel": {
                    "deepspeed": {"stage": 3, "offload_optimizer": "cpu", "pin_memory": False}
                }
            },
        ),
        2,
    ),
    "zero3@1": (
        deep_update(
            _ZERO,
            {
                "parallel": {"deepspeed": {"stage": 3}},
                "train": {"micro_batch_size": 2, "grad_accum_steps": 4},
            },
        ),
        1,
    ),
}


def shared_extra(name: str) -> dict:
    """The config (beside TINY) a shared run trained with: CKPT5 + its layout."""
    return deep_update(CKPT5, SHARED[name][0])


class SharedRuns:
    """``shared_run(name)``: the run directory of SHARED[name], trained on first use (it waits);
    ``shared_run.start(*names)`` starts them in the background (POOL) and returns at once;
    ``shared_run.output(name)``: what that launch printed (stdout, stderr)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.futures: dict[str, Future[Path]] = {}

    def start(self, *names: str) -> None:
        for name in names:
            if name in self.futures or (_deepspeed_run(name) and not _HAS_DEEPSPEED):
                continue  # without DeepSpeed, asking for the run skips the test that asks
            extra, nproc = shared_extra(name), str(SHARED[name][1])
            run = name.replace("@", "-at")
            self.futures[name] = POOL.submit(
                train_run, self.root, run, extra, "--nproc", nproc, keep_output=True
            )

    def __call__(self, name: str) -> Path:
        if _deepspeed_run(name):
            pytest.importorskip("deepspeed")
        self.start(name)
        return self.futures[name].result()

    def output(self, name: str) -> tuple[str, str]:
        """The stdout and stderr of SHARED[name]'s launch (which exited 0), trained if need be."""
        run = self(name)
        out, err = ((run.parent / f"{run.name}.{ext}").read_text() for ext in ("stdout", "stderr"))
        return out, err


def _deepspeed_run(name: str) -> bool:
    return SHARED[name][0].get("parallel", {}).get("backend") == "deepspeed"


_HAS_DEEPSPEED = importlib.util.find_spec("deepspeed") is not None


@pytest.fixture(scope="session")
def shared_run(tmp_path_factory: pytest.TempPathFactory) -> SharedRuns:
    return SharedRuns(tmp_path_factory.mktemp("shared"))


# Launches in the background, four at a time: a launch is mostly process start-up (imports, much
# of it on one core, then a rendezvous that waits), so several at once keep both cores busy where
# one leaves a core idle (the full suite on 2 idle cores: 20:03 with two at a time, 14:37 with
# three, 14:11 with four). A module starts its runs here (`POOL.submit(train_run, ...)`) and each
# test waits for its own.
POOL = ThreadPoolExecutor(max_workers=4, thread_name_prefix="zerofit-run")


def wait_all(futures: Iterable[Future]) -> None:
    """Wait for background launches (their errors are the tests' to report): a module's fixture
    calls this at teardown, so that nothing of it runs on into the next module."""
    for future in futures:
        future.exception()


def pytest_sessionfinish(session: pytest.Session) -> None:
    POOL.shutdown(wait=True, cancel_futures=True)


@pytest.fixture(scope="session")
def tok_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny ChatML tokenizer folder (sft_helpers.make_tokenizer), shared by the data tests."""
    from sft_helpers import make_tokenizer  # here: it imports transformers when called

    return make_tokenizer(tmp_path_factory.mktemp("tok") / "chatml")


@pytest.fixture(scope="session")
def session_tmp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("runs")


@pytest.hookimpl(trylast=True)  # after `-m` deselection: torch is imported only for gpu tests kept
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked `gpu` are skipped (not failed) where torch sees no CUDA device."""
    gpu_items = [item for item in items if item.get_closest_marker("gpu")]
    if not gpu_items:
        return
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (torch.cuda.is_available() is false)")
    for item in gpu_items:
        item.add_marker(skip)


def worker_pids(launcher_pid: int) -> dict[int, int]:
    """The workers of a one-node launch, by local rank, from /proc: zerofit's are forked from the
    launcher's fork server by each rank's supervisor and named ``zerofit-rank<N>``; torchrun's are
    its children, started with LOCAL_RANK in their environment."""
    pids = [int(d.name) for d in Path("/proc").glob("[0-9]*")]
    parents = {pid: parent for pid in pids if (parent := parent_of(pid)) is not None}
    out = {}
    for pid, parent in parents.items():
        with contextlib.suppress(OSError, ValueError):
            if parent == launcher_pid:
                for var in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
                    if var.startswith(b"LOCAL_RANK="):
                        out[int(var.split(b"=")[1])] = pid
            name = Path(f"/proc/{pid}/comm").read_text().strip()
            ancestors = [parent, parents.get(parent), parents.get(parents.get(parent, -1))]
            if name.startswith("zerofit-rank") and launcher_pid in ancestors:
                out[int(name.removeprefix("zerofit-rank"))] = pid
    return out
