"""Runs that survive: preemption signals, dead ranks, restarts, non-finite values and full disks,
each ending in one line, with what was saved intact. Real 2-process runs (gloo)."""

from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import POOL, deep_update, wait_all, worker_pids, write_config

from zerofit.checkpoint import complete_checkpoints, select_checkpoint, verify

pytestmark = [pytest.mark.dist, pytest.mark.slow]

SRC = Path(__file__).resolve().parents[1] / "src"
INJECT = Path(__file__).resolve().parent / "faults_inject"
LONG = {"train": {"steps": 400}}


def start(
    tmp: Path, name: str, extra: dict, *args: str, env: dict | None = None
) -> subprocess.Popen:
    """`zerofit train` in the background, with TMPDIR inside the test's directory."""
    run_dir = tmp / name
    cfg = write_config(tmp / f"{name}.yaml", deep_update({"log": {"run_dir": str(run_dir)}}, extra))
    (tmp / "tmp").mkdir(exist_ok=True)
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", "TMPDIR": str(tmp / "tmp"), **(env or {})}
    paths = [str(SRC), *([str(INJECT)] if env else []), full_env.get("PYTHONPATH", "")]
    full_env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    cmd = [sys.executable, "-m", "zerofit.cli", "train", "-c", str(cfg), "--nproc", "2", *args]
    return subprocess.Popen(
        cmd, cwd=tmp, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def wait_for_step(proc: subprocess.Popen, run_dir: Path, step: int, limit: float = 600) -> None:
    """``limit`` is a hang guard: a run reaches step 3 in ~10 s."""
    end = time.monotonic() + limit
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise AssertionError(f"ended early ({proc.returncode}): {proc.stderr.read()[-3000:]}")
        try:
            lines = (run_dir / "metrics.jsonl").read_text().splitlines()
            if lines and json.loads(lines[-1])["step"] >= step:
                return
        except (OSError, ValueError):
            pass
        time.sleep(0.1)
    raise AssertionError(f"step {step} not reached in {limit} s")


def finish(proc: subprocess.Popen, limit: float = 600) -> tuple[int, str, float]:
    """Wait for the launcher (``limit``: a hang guard); its exit code, stderr and the wait."""
    t0 = time.monotonic()
    _, err = proc.communicate(timeout=limit)
    return proc.returncode, err.strip(), time.monotonic() - t0


def leftovers(tmp: Path) -> list[str]:
    """Temporary files of the launcher or torchelastic (torch's inductor cache dir is a cache)."""
    return [
        p.name for p in (tmp / "tmp").iterdir() if p.name.startswith(("zerofit", "torchelastic"))
    ]


def worker_pid(launcher: subprocess.Popen, local_rank: int) -> int:
    found = worker_pids(launcher.pid)
    assert local_rank in found, "worker not found"
    return found[local_rank]


# ----------------------------------------------------------------------------- NaN and inf
# The runs of this section and the next only start and end: they are all started together in the
# background (two at a time) by the `completed` fixture, before the tests further down that signal
# or kill runs (whose timing they would disturb) start theirs.
DIVERGE = {
    "optim": {"lr": 1e30, "weight_decay": 0.0},
    "train": {"steps": 6},
    "checkpoint": {"every": 1, "keep_last": 10},
}
DIVERGING = ["ddp", "fsdp", "deepspeed"]
SKIPPING = ["fsdp", "deepspeed"]
DISKS = ["tmpfs", "injected"]


def _to_end(tmp: Path, extra: dict, env: dict | None = None) -> tuple[int, str]:
    code, err, _ = finish(start(tmp, "run", extra, env=env))
    return code, err


def _tmpfs(path: Path, size: str) -> bool:
    path.mkdir()
    if os.geteuid() != 0:
        return False
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)])
    return done.returncode == 0


@pytest.fixture(scope="module")
def completed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    """{case: (its directory, the Future of its (exit code, stderr)), or None where it cannot
    run (the tmpfs without root)}."""
    jobs: dict = {}

    def submit(case: tuple[str, str], extra: dict, env: dict | None = None) -> None:
        tmp = tmp_path_factory.mktemp("-".join(case))
        jobs[case] = (tmp, POOL.submit(_to_end, tmp, extra, env))

    for backend in DIVERGING:
        extra = deep_update(DIVERGE, {"parallel": {"backend": backend}})
        if backend == "deepspeed":
            extra = deep_update(extra, {"train": {"steps": 3}})
        submit(("diverge", backend), extra)
    for backend in SKIPPING:
        extra = {"train": {"steps": 5, "on_nonfinite": "skip"}, "parallel": {"backend": backend}}
        submit(("skip", backend), extra, env={"ZEROFIT_TEST_NAN_AT": "3"})
    submit(
        ("skip", "too many"),
        deep_update(DIVERGE, {"train": {"on_nonfinite": "skip", "max_skipped_steps": 2}}),
    )
    mounted = []
    for how in DISKS:
        tmp = tmp_path_factory.mktemp(f"disk-{how}")
        disk = tmp / "disk"
        extra = {"train": {"steps": 8}, "checkpoint": {"every": 2, "dir": str(disk / "ck")}}
        env = None
        if how == "tmpfs":
            if not _tmpfs(disk, "30m"):  # one ~22 MB checkpoint fits, two do not
                jobs["disk", how] = None
                continue
            mounted.append(disk)
        else:
            env = {"ZEROFIT_TEST_ENOSPC": "step_00000004.tmp"}
        jobs["disk", how] = (tmp, POOL.submit(_to_end, tmp, extra, env))
    try:
        yield jobs
    finally:
        wait_all(job[1] for job in jobs.values() if job is not None)
        for disk in mounted:
            subprocess.run(["umount", str(disk)])


@pytest.mark.parametrize("backend", DIVERGING)
def test_a_diverging_run_stops_naming_the_step_and_saves_no_nan(completed, backend: str) -> None:  # noqa: ANN001
    import torch

    from zerofit.backends import checkpoint_readers
    from zerofit.checkpoint.neutral import NeutralView, open_reader

    tmp_path, job = completed["diverge", backend]
    code, err = job.result()
    assert code == 3, err[-3000:]
    assert len(err.splitlines()) == 1, err
    assert "stopped at step 2: the loss is nan" in err, err
    assert "the update was not applied (train.on_nonfinite: stop)" in err
    saved = complete_checkpoints(tmp_path / "run" / "checkpoints")
    assert [p.name for p in saved] == ["step_00000001"]
    assert f"the last good checkpoint is {saved[0]}" in err
    where = saved[0] / "model"
    fmt = verify(saved[0])["format"]
    view = NeutralView(open_reader(where, fmt, checkpoint_readers()), where)
    assert view.entries
    for key in view.entries:  # weights and AdamW moments
        assert torch.isfinite(view.read(key).float()).all(), key


@pytest.mark.parametrize("backend", SKIPPING)
def test_skip_drops_a_nan_step_and_goes_on(completed, backend: str) -> None:  # noqa: ANN001
    tmp_path, job = completed["skip", backend]
    code, err = job.result()
    assert code == 0, err[-3000:]
    records = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").open()]
    skipped = [r for r in records if r.get("skipped")]
    assert [r["step"] for r in skipped] == [3]
    assert skipped[0]["loss"] is None and "loss" in skipped[0]["nonfinite"]
    assert all(math.isfinite(r["loss"]) for r in records if not r.get("skipped"))
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["nonfinite_skips"] == 1 and summary["loss_scale_skips"] == 0


def test_skip_stops_after_too_many_in_a_row(completed) -> None:  # noqa: ANN001
    tmp_path, job = completed["skip", "too many"]
    code, err = job.result()
    assert code == 3, err
    assert "stopped at step 4:" in err and "3 non-finite steps in a row" in err, err
    # The skipped steps' checkpoints hold step 1's (finite) weights.
    assert [p.name for p in complete_checkpoints(tmp_path / "run" / "checkpoints")][-1] == (
        "step_00000003"
    )


# ----------------------------------------------------------------------------- full disk
@pytest.mark.parametrize("how", DISKS)
def test_a_full_disk_names_the_errno_and_keeps_the_previous_checkpoint(completed, how: str) -> None:  # noqa: ANN001
    if completed["disk", how] is None:
        pytest.skip("mounting a tmpfs needs root")
    tmp_path, job = completed["disk", how]
    disk = tmp_path / "disk"
    code, err = job.result()
    assert code == 4, err
    assert len(err.splitlines()) == 1, err
    # Ranks may see different free space once one has removed its partial files; the
    # launcher then names the rank whose record it quotes.
    assert re.match(
        r"error: (\(rank \d\) )?could not save the checkpoint of step 4: "
        r"No space left on device \(ENOSPC\)",
        err,
    ), err
    previous = disk / "ck" / "step_00000002"
    assert f"The previous checkpoint ({previous}) is intact" in err
    assert select_checkpoint(disk / "ck")[0] == previous  # what --resume takes
    assert not list((disk / "ck").glob("*.tmp"))


# ----------------------------------------------------------------------------- preemption
def test_sigterm_finishes_the_step_saves_and_exits_143(tmp_path: Path) -> None:
    proc = start(tmp_path, "run", LONG)
    wait_for_step(proc, tmp_path / "run", 3)
    proc.send_signal(signal.SIGTERM)
    code, err, took = finish(proc)
    assert code == 143, err
    assert len(err.splitlines()) == 1, err
    assert err.startswith("stopped at step ") and " by SIGTERM; saved " in err, err
    step = int(err.split()[3].rstrip(";"))
    ckpt, meta, _ = select_checkpoint(tmp_path / "run" / "checkpoints")
    assert meta["step"] == step and ckpt.name == f"step_{step:08d}"
    assert took < 30
    assert not leftovers(tmp_path), "temporary files left behind"
    # The printed command continues the run.
    command = err.split("continue with: ")[1]
    assert command == f"zerofit train -c {tmp_path / 'run' / 'config.yaml'} --resume"
    cfg = tmp_path / "run" / "config.yaml"
    cfg.write_text(cfg.read_text().replace("steps: 400", f"steps: {step + 2}"))
    resumed = subprocess.run(
        [sys.executable, "-m", "zerofit.cli", "train", "-c", str(cfg), "--nproc", "2", "--resume"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(SRC)},
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resuming from {ckpt}" in resumed.stderr


def test_second_sigint_stops_at_once_keeping_the_last_checkpoint(tmp_path: Path) -> None:
    slow = {"checkpoint": {"every": 2}, "train": {"micro_batch_size": 48}}  # ~1 s steps
    proc = start(tmp_path, "run", deep_update(LONG, slow))
    wait_for_step(proc, tmp_path / "run", 3)
    proc.send_signal(signal.SIGINT)
    while not list((tmp_path / "tmp").glob("zerofit-launch-*/errors/STOP")):
        time.sleep(0.005)  # the launcher took the first one (signals sent together merge)
    proc.send_signal(signal.SIGINT)
    code, err, took = finish(proc)
    assert code == 130, err
    lines = [x for x in err.splitlines() if not x.startswith("note: ")]  # the launch's own notes
    assert len(lines) == 1 and lines[0].startswith("stopped at once by a second SIGINT"), err
    assert took < 15
    root = tmp_path / "run" / "checkpoints"
    newest = complete_checkpoints(root)[-1]
    verify(newest)  # the last good checkpoint is whole
    assert f"The last checkpoint is {newest}" in err
    assert not list(root.glob("*.tmp")), "the interrupted save was not cleaned up"
    assert not leftovers(tmp_path)


def test_signals_reach_workers_started_by_torchrun(tmp_path: Path) -> None:
    """An external launcher (torchrun here; srun signals every task the same way): the signal
    goes to each worker, rank 0 prints the line, every worker exits 143."""
    run_dir = tmp_path / "run"
    cfg = write_config(tmp_path / "run.yaml", deep_update(LONG, {"log": {"run_dir": str(run_dir)}}))
    env = {**os.environ, "PYTHONPATH": str(SRC), "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    cmd += ["-m", "zerofit.cli", "train", "-c", str(cfg)]
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stderr=subprocess.PIPE, text=True)
    wait_for_step(proc, run_dir, 3)
    for rank in (0, 1):
        os.kill(worker_pid(proc, rank), signal.SIGTERM)
    _, err, _ = finish(proc)
    ours = [line for line in err.splitlines() if line.startswith("stopped at step")]
    assert len(ours) == 1, err[-3000:]
    step = int(ours[0].split()[3].rstrip(";"))
    assert select_checkpoint(run_dir / "checkpoints")[1]["step"] == step
    assert "exitcode: 143" in err or "exit code: 143" in err or "143" in err


# ----------------------------------------------------------------------------- dead ranks
def test_a_killed_rank_ends_the_job_with_its_signal_and_host_memory(tmp_path: Path) -> None:
    proc = start(tmp_path, "run", LONG)
    wait_for_step(proc, tmp_path / "run", 2)
    os.kill(worker_pid(proc, 1), signal.SIGKILL)
    code, err, took = finish(proc)
    assert code == 1
    assert len(err.splitlines()) == 1, err
    assert err.startswith("error: rank 1 was killed by SIGKILL: likely the host's out-of-memory")
    assert "GiB of RAM" in err and "No checkpoint was saved" in err
    assert took < 60
    assert not leftovers(tmp_path)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="parent-death signal is Linux's")
def test_a_launcher_killed_outright_takes_its_workers_with_it(tmp_path: Path) -> None:
    proc = start(tmp_path, "run", LONG)
    wait_for_step(proc, tmp_path / "run", 2)
    workers = [worker_pid(proc, 0), worker_pid(proc, 1)]
    proc.kill()  # SIGKILL: no handler runs, nothing is forwarded
    proc.communicate(timeout=30)
    end = time.monotonic() + 20
    while any(_alive(w) for w in workers) and time.monotonic() < end:
        time.sleep(0.1)
    assert not [w for w in workers if _alive(w)], "workers outlived their launcher"


def test_restart_after_a_killed_rank_ends_with_the_uninterrupted_loss(
    tmp_path: Path, shared_run
) -> None:  # noqa: ANN001
    reference = shared_run("fsdp@2")  # the same 10 steps uninterrupted (checkpoints at 5, 10)
    extra = {"train": {"steps": 10}, "checkpoint": {"every": 2}}
    proc = start(tmp_path, "run", deep_update(extra, {"train": {"max_restarts": 1}}))
    wait_for_step(proc, tmp_path / "run", 5)
    os.kill(worker_pid(proc, 1), signal.SIGKILL)
    code, err, _ = finish(proc)
    out = proc.stdout.read() if proc.stdout and not proc.stdout.closed else ""
    assert code == 0, err[-3000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    expected = json.loads((reference / "summary.json").read_text())
    assert summary["final_step_loss"] == expected["final_step_loss"]
    steps = [json.loads(x)["step"] for x in (tmp_path / "run" / "metrics.jsonl").open()]
    assert steps == sorted(set(steps)) and steps[-1] == 10  # one record per step
    del out
