"""Issue 27: one run per run folder, and advice that works when followed.

- `zerofit train` locks its run folder for the whole run (`zerofit.launch.run_lock`): a second
  `zerofit train` or `--resume` there stops with one line naming the holder's pid, exit 2; the
  kernel drops the lock when the holder dies, so a killed run never leaves the folder locked.
- A run stopped before its first checkpoint prints "continue with: ... --resume", and following it
  starts the run again from step 0 in its own folder (it used to say "no complete checkpoint").

Real processes: `zerofit train` on the tiny CPU config (gloo); timeouts are hang guards only.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import deep_update, worker_pids, write_config

from zerofit.errors import UserError
from zerofit.launch import run_lock
from zerofit.launch.options import LaunchOptions
from zerofit.launch.prepare import prepare_run
from zerofit.launch.run_config import load_config

SRC = Path(__file__).resolve().parents[1] / "src"
ENV = {**os.environ, "PYTHONPATH": str(SRC), "PYTHONUNBUFFERED": "1"}
HANG = 900  # seconds: a hang guard, never a speed check (a launch takes 5-40 s on 2 busy cores)
CLI = [sys.executable, "-m", "zerofit.cli"]


def in_use(run_dir: Path, pid: int) -> str:
    return (
        f"error: run directory {run_dir} is in use by another zerofit train (pid {pid}); wait "
        "for it to end, or choose another log.run_dir"
    )


def train(cfg: Path, *args: str) -> subprocess.Popen:
    """`zerofit train -c cfg --nproc 1 ARGS` in the background (its stderr kept)."""
    cmd = [*CLI, "train", "-c", str(cfg), "--nproc", "1", *args]
    return subprocess.Popen(
        cmd, cwd=cfg.parent, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )


def ended(proc: subprocess.Popen) -> tuple[int, str]:
    _, err = proc.communicate(timeout=HANG)
    return proc.returncode, err.strip()


def steps(run_dir: Path) -> list[int]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line)["step"] for line in lines]


def wait_for(predicate, proc: subprocess.Popen) -> None:  # noqa: ANN001
    end = time.monotonic() + HANG
    while not predicate():
        if proc.poll() is not None:
            raise AssertionError(f"ended early ({proc.returncode}): {proc.stderr.read()[-3000:]}")  # type: ignore[union-attr]
        assert time.monotonic() < end, "hang guard"
        time.sleep(0.02)


# ----------------------------------------------------------------------------- the lock itself
HOLD = """
import sys, time
from pathlib import Path
from zerofit.launch import run_lock
run_lock.hold(Path(sys.argv[1]), node=int(sys.argv[2]) if len(sys.argv) > 2 else 0)
print("held", flush=True)
time.sleep(600)
"""


def test_the_lock_names_its_holder_and_dies_with_it(tmp_path: Path) -> None:
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(tmp_path)], env=ENV, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        assert (tmp_path / run_lock.LOCK_FILE).read_text() == f"{holder.pid}\n"
        with pytest.raises(UserError) as err:
            run_lock.hold(tmp_path)
        assert f"error: {err.value}" == in_use(tmp_path, holder.pid)
    finally:
        holder.send_signal(signal.SIGKILL)  # no clean-up runs: the kernel drops the lock
        holder.wait(timeout=60)
    try:
        run_lock.hold(tmp_path)
        run_lock.hold(tmp_path)  # held already by this process: no-op
        assert (tmp_path / run_lock.LOCK_FILE).read_text() == f"{os.getpid()}\n"
    finally:
        run_lock.release_all()


def test_a_second_jobs_node_is_refused_by_that_nodes_own_lock(tmp_path: Path) -> None:
    """Nodes > 0 of a multi-node run lock the shared folder too, each under its own name: node 1
    of a second job on the same log.run_dir is refused in prepare_run (one line naming the pid)
    before it starts its workers, while node 0's lock and node 2's are separate."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    cfg = load_config(str(write_config(tmp_path / "c.yaml", {"log": {"run_dir": str(run_dir)}})))
    node1 = LaunchOptions(nnodes=3, node_rank=1, rdzv_endpoint="localhost:1")
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(run_dir), "1"], env=ENV, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        assert (run_dir / "zerofit.node1.lock").read_text() == f"{holder.pid}\n"
        with pytest.raises(UserError) as err:
            prepare_run(cfg, node1, 6, "cpu", create=False)
        assert str(err.value) == (
            f"run directory {run_dir} is in use by node 1 of another multi-node run (pid "
            f"{holder.pid}); wait for it to end, or choose another log.run_dir"
        )
        run_lock.hold(run_dir)  # node 0's lock is another file
        node2 = LaunchOptions(nnodes=3, node_rank=2, rdzv_endpoint="localhost:1")
        prep = prepare_run(cfg, node2, 6, "cpu", create=False)
        assert (run_dir / "zerofit.node2.lock").read_text() == f"{os.getpid()}\n"
        assert prep.config_file.parent != run_dir  # a non-zero node writes nothing there
    finally:
        run_lock.release_all()
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=60)


# ----------------------------------------------------------------------------- real runs
@pytest.mark.dist
@pytest.mark.slow
def test_two_runs_started_at_once_on_one_folder(tmp_path: Path) -> None:
    """Both used to run, interleaving metrics.jsonl and corrupting each other's checkpoint."""
    run_dir = tmp_path / "run"
    cfg = write_config(tmp_path / "c.yaml", {"log": {"run_dir": str(run_dir)}})
    procs = [train(cfg), train(cfg)]  # at once
    results = [ended(p) for p in procs]
    codes = sorted(code for code, _ in results)
    assert codes == [0, 2], [err[-2000:] for _, err in results]
    winner = next(p for p, (code, _) in zip(procs, results, strict=True) if code == 0)
    loser_err = next(err for code, err in results if code == 2)
    assert loser_err.splitlines() == [in_use(run_dir, winner.pid)], loser_err
    assert steps(run_dir) == list(range(1, 11))  # one run's records, once each


@pytest.mark.dist
@pytest.mark.slow
def test_a_killed_run_leaves_its_folder_usable(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    cfg = write_config(
        tmp_path / "c.yaml", {"log": {"run_dir": str(run_dir)}, "train": {"steps": 5000}}
    )
    first = train(cfg)
    try:
        wait_for(lambda: (run_dir / "metrics.jsonl").is_file(), first)  # training
        code, err = ended(train(cfg, "--resume"))  # while it runs: refused, nothing touched
        assert (code, err.splitlines()[-1]) == (2, in_use(run_dir, first.pid)), err[-2000:]
    finally:
        first.send_signal(signal.SIGKILL)  # the launcher: its workers go with it
        first.wait(timeout=60)
    code, err = ended(train(cfg, "--resume", "--train.steps", "3"))
    assert code == 0, err[-3000:]
    assert "it starts again from step 0" in err  # nothing was saved (checkpoint.every: 0)
    assert steps(run_dir) == [1, 2, 3]


def _handlers_installed(launcher: subprocess.Popen, count: int) -> bool:
    """Whether `count` workers of ``launcher`` run and each has its SIGTERM handler (the first
    thing a worker does): a stop now comes before the first step, so before any checkpoint."""
    found = 0
    for pid in worker_pids(launcher.pid).values():
        try:
            status = Path(f"/proc/{pid}/status").read_text().splitlines()
        except OSError:
            continue
        caught = int(next(x for x in status if x.startswith("SigCgt")).split()[1], 16)
        found += bool(caught & (1 << (signal.SIGTERM - 1)))
    return found >= count


@pytest.mark.dist
@pytest.mark.slow
def test_a_stop_before_the_first_save_advises_what_works(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    extra = deep_update({"log": {"run_dir": str(run_dir)}}, {"train": {"steps": 400}})
    cfg = write_config(tmp_path / "c.yaml", extra)
    proc = subprocess.Popen(
        [*CLI, "train", "-c", str(cfg), "--nproc", "2"],
        cwd=tmp_path,
        env=ENV,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    wait_for(lambda: _handlers_installed(proc, 2), proc)
    proc.send_signal(signal.SIGTERM)
    code, err = ended(proc)
    assert code == 143, err[-3000:]
    line = err.splitlines()[-1]
    assert line.startswith("stopped at step 0 by SIGTERM; nothing saved yet"), line
    advice = shlex.split(line.split("continue with: ")[1])
    assert advice == ["zerofit", "train", "-c", str(run_dir / "config.yaml"), "--resume"]
    saved = run_dir / "config.yaml"
    saved.write_text(saved.read_text().replace("steps: 400", "steps: 3"))
    followed = subprocess.run(
        [*CLI, *advice[1:]], cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=HANG
    )
    assert followed.returncode == 0, followed.stderr[-3000:]
    assert (
        f"note: --resume: no checkpoint under {run_dir / 'checkpoints'} yet (the run stopped "
        f"before its first save): it starts again from step 0 in {run_dir}" in followed.stderr
    )
    assert steps(run_dir) == [1, 2, 3]


# ----------------------------------------------------------------------------- which folders start again
def test_resume_starts_again_only_a_run_that_stopped_before_its_first_save(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Starting again is for a folder holding the run's config.yaml, no checkpoint and no summary.
    A folder without the run's config.yaml (a mistyped log.run_dir) or a run that finished without
    a checkpoint is still "no complete checkpoint"."""
    run_dir = tmp_path / "run"
    cfg = load_config(str(write_config(tmp_path / "c.yaml", {"log": {"run_dir": str(run_dir)}})))
    resume = LaunchOptions(resume="latest")
    refusal = f"--resume: no complete checkpoint under {run_dir / 'checkpoints'}"
    run_dir.mkdir()
    try:
        with pytest.raises(UserError, match=f"^{refusal}$"):
            prepare_run(cfg, resume, 1, "cpu")  # no config.yaml: never a run here
        (run_dir / "config.yaml").write_text("stale: the stopped run's\n")
        (run_dir / "metrics.jsonl").write_text('{"step": 1, "loss": 5.0}\n')
        (run_dir / "summary.json").write_text("{}")  # it ran to its end, saving nothing
        with pytest.raises(UserError, match=f"^{refusal}$"):
            prepare_run(cfg, resume, 1, "cpu")
        (run_dir / "summary.json").unlink()  # stopped before its first save
        capsys.readouterr()
        prep = prepare_run(cfg, resume, 1, "cpu")
    finally:
        run_lock.release_all()
    assert prep.resume_from is None and prep.config_file == run_dir / "config.yaml"
    assert "stale" not in prep.config_file.read_text()  # the new run's config
    assert not (run_dir / "metrics.jsonl").read_text()  # the stopped run's records moved aside
    assert (run_dir / "metrics.abandoned.jsonl").is_file()
    assert "it starts again from step 0" in capsys.readouterr().err


def test_a_first_start_that_finds_the_stop_marker_meets_its_peers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The launcher writes STOP (with the signal) before forwarding the signal to the workers it
    sees. A worker that starts in between must not exit alone: its peers may already wait for it
    in init_process_group (a hang seen in CI). It takes the stop as received and goes on, to stop
    with them at step 0; only a restarted worker exits at once. The handlers stay installed, so
    the forwarded copy of the signal cannot kill it."""
    from zerofit.faults.signals import STOP_MARKER, StopSignals
    from zerofit.train import worker

    (tmp_path / STOP_MARKER).write_text(str(int(signal.SIGINT)))
    monkeypatch.delenv("TORCHELASTIC_RESTART_COUNT", raising=False)
    stops = StopSignals()
    assert not worker.stop_requested(tmp_path, stops)
    assert stops.signum == signal.SIGINT
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    assert worker.stop_requested(tmp_path, StopSignals())
    assert not worker.stop_requested(tmp_path / "elsewhere", StopSignals())
    seen = []
    monkeypatch.setattr(worker, "run_worker", lambda *a: seen.append(a[-1].signum) or 0)
    monkeypatch.delenv("TORCHELASTIC_RESTART_COUNT")
    previous = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        args = ["--config", "c.yaml", "--run-dir", str(tmp_path), "--error-dir", str(tmp_path)]
        assert worker.main(args) == 0
        assert seen == [signal.SIGINT]  # it went on to train, with the stop recorded
        assert signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, None)
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
