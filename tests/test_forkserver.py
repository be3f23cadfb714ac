"""The launcher's fork server (`zerofit.launch.forkserver`) and the workers forked from it
(`zerofit.train.forked`): what a fork must have that a fresh process had."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import train_run

from zerofit.faults.signals import parent_of
from zerofit.train import forked

SRC = Path(__file__).resolve().parents[1] / "src"
# Starts the server, has it fork one process once its imports are done, and prints the server's
# thread count and what the fork found imported before it imported anything itself.
PROBE = """
import json, multiprocessing, os, sys
from zerofit.launch import forkserver

def loaded(queue):
    queue.put([m for m in ("torch", "torch._dynamo", "zerofit.train.forked") if m in sys.modules])

if __name__ == "__main__":
    forkserver.start()
    ctx = multiprocessing.get_context(forkserver.METHOD)
    queue = ctx.Queue()
    child = ctx.Process(target=loaded, args=(queue,))
    child.start()
    found = queue.get(timeout=300)
    child.join()
    server = forkserver.helper_pids() - {child.pid}
    threads = {pid: len(os.listdir(f"/proc/{pid}/task")) for pid in server}
    print(json.dumps({"found": found, "threads": threads, "omp": os.environ.get("OMP_NUM_THREADS")}))
"""


def test_the_fork_server_imports_the_workers_modules_on_one_thread(tmp_path: Path) -> None:
    """A fork of a process whose OpenMP pool exists hangs at its first parallel op (a one-process
    two-node run hung so): the server imports torch without starting any thread, and the launcher's
    own OMP_NUM_THREADS is left as it was."""
    (tmp_path / "probe.py").write_text(PROBE)
    env = {"PYTHONPATH": str(SRC), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "2"}
    out = subprocess.run(
        [sys.executable, "probe.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,  # a hang guard
    )
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["found"] == ["torch", "torch._dynamo", "zerofit.train.forked"]
    assert got["threads"] and all(n == 1 for n in got["threads"].values()), got
    assert got["omp"] == "2"


@pytest.mark.parametrize("nproc", [1, 2])
def test_each_worker_computes_on_the_threads_the_launcher_gives_it(
    tmp_path: Path, nproc: int
) -> None:
    """The launcher gives each rank cores / ranks threads (the fork server imported torch with
    one); env.json records what rank 0 computed on."""
    extra = {"train": {"steps": 1}, "checkpoint": {"save_final": False}}
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("OMP_NUM_THREADS", raising=False)
        run = train_run(tmp_path, "run", extra, "--nproc", str(nproc))
    want = max(1, (os.cpu_count() or 1) // nproc)
    env = json.loads((run / "env.json").read_text())
    assert env["threads"] == want
    assert env["env"]["OMP_NUM_THREADS"] == str(want)


def test_a_stop_signal_after_the_worker_is_reaped_cannot_break_the_supervisor() -> None:
    """The agent stops a failed rank's supervisor with SIGTERM, which may land after the
    supervisor has reaped its worker: passing it on must not raise, or the supervisor dies before
    it writes the rank's exit status and the launcher blames a peer's gloo error instead."""
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)  # reaped: the pid is free (or someone else's, which `kill` would hit)
    forked._pass_on(pid, signal.SIGTERM)


def test_a_supervisor_ends_as_its_killed_worker_did_and_says_so(tmp_path: Path) -> None:
    """A rank's worker killed by SIGKILL: its supervisor writes the status and ends killed by
    SIGKILL too. It once tried to reset SIGKILL's action, which raises, and so ended with status 1
    (an error file the agent reported over the supervisor's file): the launcher then blamed the
    peer's gloo error, whenever the agent saw this rank end first."""
    supervisor = os.fork()
    if supervisor == 0:  # the supervisor, with a worker that only waits to be killed
        forked._work = lambda _argv, _rank: (time.sleep(60), os._exit(0))  # type: ignore[assignment]
        try:
            forked.forked([], dict(os.environ), str(tmp_path))
        finally:
            os._exit(3)
    deadline = time.monotonic() + 30
    while not (workers := children(supervisor)) and time.monotonic() < deadline:
        time.sleep(0.05)
    os.kill(workers[0], signal.SIGKILL)
    _, status = os.waitpid(supervisor, 0)
    assert os.waitstatus_to_exitcode(status) == -signal.SIGKILL
    assert forked.exit_statuses(tmp_path) == {0: -signal.SIGKILL}


def children(pid: int) -> list[int]:
    return [int(p.name) for p in Path("/proc").glob("[0-9]*") if parent_of(int(p.name)) == pid]


def test_a_hugging_face_runs_workers_start_with_transformers_where_no_gpu_is(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`preload_for`: a run of a Hugging Face model preloads transformers' modelling code
    (`zerofit.models.hf_preload`), only without NVIDIA devices; any other run does not."""
    from zerofit.launch import forkserver  # here: the module holds the server's state

    devices: list[Path] = []
    monkeypatch.setattr(Path, "glob", lambda self, pattern: iter(devices))
    assert forkserver.preload_for(False) == forkserver.PRELOAD
    assert forkserver.preload_for(True) == forkserver.PRELOAD + forkserver.HF_PRELOAD
    devices.append(Path("/dev/nvidia0"))
    assert forkserver.preload_for(True) == forkserver.PRELOAD


def test_the_hugging_face_preload_resolves_what_the_workers_ask_for() -> None:
    """In a fresh interpreter, the preload module leaves transformers' lazy names resolved:
    a worker forked after it imports nothing more to reach them."""
    pytest.importorskip("transformers")
    code = (
        "import sys\n"
        "import transformers\n"
        "before = sorted(n for n in ('AutoConfig', 'AutoModelForCausalLM') if n in vars(transformers))\n"
        "import zerofit.models.hf_preload\n"
        "after = sorted(n for n in ('AutoConfig', 'AutoModelForCausalLM') if n in vars(transformers))\n"
        "print(before, after, 'transformers.modeling_utils' in sys.modules)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300
    )
    assert out.returncode == 0, out.stderr[-2000:]
    # resolved names are set on the lazy module: before, neither; after, both, and the modelling code
    assert out.stdout.split("\n")[0] == "[] ['AutoConfig', 'AutoModelForCausalLM'] True"
