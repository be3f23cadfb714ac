"""NVMe offload (ZeRO-Infinity): refused in one line before any rank starts when this machine or
the disk cannot take it, planned from the bytes that go to disk, and a real 2-rank run on CPU
(gloo, DeepSpeed's CPU accelerator) that trains as CPU offload does and resumes exactly."""

from __future__ import annotations

import errno
import json
import os
import threading
import time
from collections import namedtuple
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import (
    CKPT5,
    POOL,
    assert_resume_exact,
    deep_update,
    losses,
    train_run,
    write_config,
    zerofit,
)

from zerofit.backends import engine_of
from zerofit.backends.deepspeed import nvme
from zerofit.backends.deepspeed.checkpoint import ZeroCheckpointReader
from zerofit.backends.deepspeed.costs import (
    BLOCK_TENSORS,
    OPT_SWAPPED,
    PARAM_MAX_IN_CPU,
    nvme_terms,
    param_swap_buffers,
    sub_groups,
)
from zerofit.backends.deepspeed.ds_json import to_ds_json
from zerofit.backends.deepspeed.options import DeepSpeedOptions
from zerofit.backends.terms import Workload
from zerofit.cli import main
from zerofit.config.sizes import human_bytes
from zerofit.errors import UserError
from zerofit.launch.prepare import check_machine
from zerofit.launch.resolve import resolve
from zerofit.launch.run_config import load_config
from zerofit.models.shape import shape_from_config, shape_from_preset
from zerofit.planner import disk
from zerofit.planner.disk import disk_seconds, probe
from zerofit.planner.memory import Strategy, strategy_for, workload_for
from zerofit.planner.plan import candidates, evaluate
from zerofit.planner.shape import Hardware

NVME = {"stage": 3, "offload_optimizer": "nvme", "pin_memory": False}
Usage = namedtuple("Usage", "total used free")


def resolved(nvme_path: Path | str, *more: str, device: str = "cpu"):  # noqa: ANN201
    """The default config with ZeRO-3's optimizer on NVMe in `nvme_path`, resolved for 2 ranks
    on `device` as the launcher resolves it."""
    keys = [f"parallel.deepspeed.{k}={v}" for k, v in NVME.items()]
    path = f"parallel.deepspeed.nvme_path={nvme_path}"
    cfg = load_config(None, ["parallel.backend=deepspeed", *keys, path, *more])
    return resolve(cfg, 2, device)


@pytest.fixture
def aio_builds(monkeypatch: pytest.MonkeyPatch) -> None:
    """The disk checks alone: DeepSpeed's async_io op taken as buildable here."""
    monkeypatch.setattr(nvme, "aio_missing", lambda: None)


def planned_per_rank(cfg) -> float:  # noqa: ANN001
    eng = engine_of(cfg)
    return eng.memory(shape_from_config(cfg), workload_for(cfg, 2), eng.opts(cfg)).nvme


# ---------------------------------------------------------------- refused up front


def test_a_missing_nvme_path_is_refused(tmp_path: Path, aio_builds: None) -> None:
    with pytest.raises(UserError, match=r"nvme_path: .*/nope does not exist; create it"):
        check_machine(resolved(tmp_path / "nope"), 2, 2)


def test_an_nvme_path_that_is_a_file_is_refused(tmp_path: Path, aio_builds: None) -> None:
    (tmp_path / "f").write_text("x")
    with pytest.raises(UserError, match=r"nvme_path: .*/f is not a directory"):
        check_machine(resolved(tmp_path / "f"), 2, 2)


def test_an_unwritable_nvme_path_is_refused(
    tmp_path: Path, aio_builds: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o555)
    if os.geteuid() == 0:  # root writes through the mode bits: the OS's refusal, simulated

        def refuse(*args: object, **kwargs: object) -> None:
            raise PermissionError(errno.EACCES, "Permission denied")

        monkeypatch.setattr(nvme.tempfile, "mkstemp", refuse)
    with pytest.raises(UserError, match=r"nvme_path: .*/ro is not writable \(Permission denied\)"):
        check_machine(resolved(folder), 2, 2)


def _refuses_o_direct(folder: Path) -> bool:
    return nvme._direct_io_refused(folder) is not None


def test_an_nvme_path_without_o_direct_is_refused(
    tmp_path: Path, aio_builds: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """tmpfs refused O_DIRECT before Linux 6.6: /dev/shm is the real case where it still does;
    elsewhere the filesystem's EINVAL is simulated at the open."""
    shm = Path("/dev/shm")
    folder = (
        shm if shm.is_dir() and os.access(shm, os.W_OK) and _refuses_o_direct(shm) else tmp_path
    )
    if folder == tmp_path:
        real_open = os.open

        def no_direct(path: str, flags: int, *args: int) -> int:
            if flags & os.O_DIRECT:
                raise OSError(errno.EINVAL, "Invalid argument")
            return real_open(path, flags, *args)

        monkeypatch.setattr(nvme.os, "open", no_direct)
    with pytest.raises(
        UserError, match=r"is on a filesystem without O_DIRECT \(Invalid argument\)"
    ):
        check_machine(resolved(folder), 2, 2)
    assert not list(folder.glob(".zerofit-odirect-*")), "the probe file is left behind"


def test_no_room_for_the_planned_bytes_gives_needed_and_free(
    tmp_path: Path, aio_builds: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = resolved(tmp_path)
    per_rank = planned_per_rank(cfg)
    assert per_rank > 0
    monkeypatch.setattr(nvme.shutil, "disk_usage", lambda _: Usage(2**40, 2**40, 2**20))
    with pytest.raises(UserError) as e:
        check_machine(cfg, 2, 2)
    line = str(e.value)
    assert "\n" not in line
    assert f"has 1.00 MiB free; NVMe offload needs {human_bytes(2 * per_rank)} there" in line
    assert f"(2 rank(s) x {human_bytes(per_rank)} of parallel.deepspeed.offload_optimizer" in line
    monkeypatch.setattr(nvme.shutil, "disk_usage", lambda _: Usage(2**40, 0, 2 * per_rank))
    check_machine(cfg, 2, 2)  # just enough room


def test_a_machine_without_libaio_is_told_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(nvme, "_prebuilt_op", lambda: False)
    monkeypatch.setattr(nvme, "_include_dirs", lambda: [str(tmp_path)])
    monkeypatch.setattr(nvme, "_library_dirs", lambda: [str(tmp_path)])
    with pytest.raises(UserError) as e:
        check_machine(resolved(tmp_path), 2, 2)
    assert str(e.value).startswith(
        "parallel.deepspeed.offload_optimizer: nvme needs DeepSpeed's async_io op, which cannot "
        "build here: libaio's header (libaio.h) and libaio.so"
    )
    assert "(apt install libaio-dev" in str(e.value) and "\n" not in str(e.value)


def test_a_usable_nvme_path_passes_and_is_left_clean(tmp_path: Path, aio_builds: None) -> None:
    check_machine(resolved(tmp_path), 2, 2)
    assert list(tmp_path.iterdir()) == []


def test_the_disk_probe_keeps_requests_in_flight_as_deepspeed_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One O_DIRECT request at a time under-read the H100 machine's disk (1.5 GB/s; DeepSpeed's
    swapping moved 2.2): the probe moves 1 MiB blocks QUEUE_DEPTH at a time, each offset once."""
    lock, now, seen, offsets = threading.Lock(), [0], [0], {"w": [], "r": []}

    def tracked(kind: str, call):  # counts the calls in flight at once
        def run(fd, buf, offset):
            with lock:
                now[0] += 1
                seen[0] = max(seen[0], now[0])
                offsets[kind].append(offset)
            time.sleep(0.05)  # long beside a thread's start, even on a busy CPU
            try:
                return call(fd, buf, offset)
            finally:
                with lock:
                    now[0] -= 1

        return run

    monkeypatch.setattr(disk.os, "pwrite", tracked("w", os.pwrite))
    monkeypatch.setattr(disk.os, "preadv", tracked("r", os.preadv))
    name = tmp_path / "f"
    name.touch()
    disk._timed_passes(str(name), 32 * disk.PROBE_BLOCK)
    assert seen[0] == disk.QUEUE_DEPTH == 8
    every = [i * disk.PROBE_BLOCK for i in range(32)]
    assert sorted(offsets["w"]) == every and sorted(offsets["r"]) == every
    assert name.stat().st_size == 32 * disk.PROBE_BLOCK


def test_nvme_offload_at_zero_1_or_2_is_refused(tmp_path: Path) -> None:
    """DeepSpeed 0.19.8's ZeRO-1/2 keep an "nvme" optimizer in host RAM: nothing goes to disk."""
    with pytest.raises(UserError, match="offload_optimizer: nvme needs stage 3 .stage is 2."):
        resolved(tmp_path, "parallel.deepspeed.stage=2")


def test_train_refuses_before_any_rank_starts(tmp_path: Path) -> None:
    """One line, exit 2, and no run folder: no worker was started."""
    run_dir = tmp_path / "run"
    extra = {"parallel": {"backend": "deepspeed", "deepspeed": {**NVME, "nvme_path": "/no/ssd"}}}
    cfg = write_config(tmp_path / "c.yaml", deep_update(extra, {"log": {"run_dir": str(run_dir)}}))
    proc = zerofit("train", "-c", str(cfg), "--nproc", "2", cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "error: parallel.deepspeed.nvme_path: /no/ssd does not exist; create it on the NVMe "
        "drive first (a mistyped mount point would fill the disk it is on)"
    ]
    assert not run_dir.exists()


# ---------------------------------------------------------------- planned


def _work(world: int = 8, micro: int = 1) -> Workload:
    return Workload(micro, 4096, world)


def test_the_bytes_on_disk_per_rank() -> None:
    """Optimizer: fp32 master, two moments and the fp32 gradient of each rank's partition;
    parameters: each rank's partition in the compute dtype, of which what passes max_in_cpu is
    read every micro-batch (forward and backward) and written back after the step."""
    m, w = shape_from_preset("70b"), _work()
    eng = engine_of(load_config(None, ["parallel.backend=deepspeed"]))
    local = m.num_params / 8
    opt = DeepSpeedOptions(offload_optimizer="nvme", offload_param="cpu", sub_group_size=10**8)
    both = DeepSpeedOptions(offload_optimizer="nvme", offload_param="nvme", sub_group_size=10**8)
    assert eng.memory(m, w, opt).nvme == pytest.approx(OPT_SWAPPED * local * 4)
    assert eng.memory(m, w, both).nvme == pytest.approx((OPT_SWAPPED * 4 + 2) * local)
    t = nvme_terms(m, w, both)
    swapped = local - PARAM_MAX_IN_CPU
    assert t.step_read == pytest.approx(4 * local * 4)
    assert t.step_write == pytest.approx(4 * local * 4 + 2 * swapped)
    assert t.micro_read == pytest.approx(2 * 2 * swapped)
    assert nvme_terms(m, w, DeepSpeedOptions(offload_optimizer="cpu")).disk == 0.0
    hw = Hardware(8, 80 * 10**9, cpu_mem=2**38, nvme=10**13)
    got = eng.offload_seconds(m, replace(w, grad_accum_steps=4), both, hw)
    assert got.disk_read == pytest.approx(t.step_read + 4 * t.micro_read)
    assert got.disk_write == pytest.approx(t.step_write)


def test_the_step_time_follows_the_disk_bandwidth() -> None:
    """Optimizer on NVMe: each step the node's ranks read and write their swap files, one after
    the other around CPU Adam; twice the bandwidth takes exactly that share off the step."""
    m, w = shape_from_preset("llama3-8b"), _work(world=4)
    s = Strategy(
        "deepspeed", DeepSpeedOptions(offload_optimizer="nvme", offload_param="cpu"), "full"
    )
    slow = Hardware(4, 80 * 10**9, cpu_mem=2**39, nvme=10**13, nvme_read_bw=2e9, nvme_write_bw=1e9)
    fast = replace(slow, nvme_read_bw=4e9, nvme_write_bw=2e9)
    a, b = evaluate(m, w, slow, s), evaluate(m, w, fast, s)
    local = m.num_params / 4
    per_rank = OPT_SWAPPED * local * 4  # read, and written
    assert disk_seconds(a, slow) == pytest.approx(4 * (per_rank / 2e9 + per_rank / 1e9))
    assert a.speed.step_time - b.speed.step_time == pytest.approx(disk_seconds(a, slow) / 2)


def test_param_swap_buffers_are_sized_to_the_model() -> None:
    """Each of offload_param's buffers holds the largest swapped partition and the largest optimizer
    sub-group, and no more: DeepSpeed's default 1e8 elements a buffer held 8.4 GB of host RAM a
    rank for a 4M-parameter model."""
    m = shape_from_preset("tiny")
    count, size = param_swap_buffers(m, 2, 10**9)
    largest = max(m.embedding_params, m.dim * max(m.ffn_dim, m.n_heads * m.head_dim)) / 2
    assert size >= largest
    assert size >= max(sub_groups(m, Workload(1, 1, 2), 10**9))
    assert count * size * 4 < 256 * 2**20, "a tiny model's swap buffers take under 256 MiB"
    big = shape_from_preset("llama3-1b")
    assert param_swap_buffers(big, 1, 10**9)[1] >= big.embedding_params  # the whole embedding


def test_parameters_on_nvme_are_kept_gathered_only_one_block_ahead() -> None:
    """A gathered parameter holds its swap buffer, and DeepSpeed keeps one gathered while it is
    used again within max_reuse_distance elements (1e9 by default: ten 3B blocks, more than the
    swap buffers hold). On NVMe the distance is one block; other offloads keep DeepSpeed's."""
    both = resolved(
        "/tmp",
        "parallel.deepspeed.offload_param=nvme",
        "parallel.deepspeed.sub_group_size=100000000",
    )
    zero = to_ds_json(both, 2)["zero_optimization"]
    assert zero["stage3_max_reuse_distance"] == shape_from_config(both).block_params
    assert zero["offload_param"]["buffer_count"] >= 2 * BLOCK_TENSORS
    host = resolved("/tmp", "parallel.deepspeed.offload_param=cpu")
    assert "stage3_max_reuse_distance" not in to_ds_json(host, 2)["zero_optimization"]


@pytest.mark.parametrize(
    ("more", "compiled"),
    [
        ([], False),  # auto: off with the parameters on the disk
        (["parallel.compile=true"], True),  # written: kept
        (["parallel.deepspeed.offload_param=cpu"], True),  # the optimizer alone on the disk
    ],
)
def test_compile_auto_is_off_with_the_parameters_on_nvme(more: list[str], compiled: bool) -> None:
    """Compiled blocks failed in Triton twice on an H100 with the parameters on NVMe (the docstring
    of `nvme.uncompiled_on_disk`); `auto` resolves to off there, on a GPU, and says so."""
    on_disk = ["parallel.deepspeed.offload_param=nvme", "parallel.deepspeed.torch_adam=true"]
    cfg = resolved("/tmp", *on_disk, *more, device="cuda")
    assert cfg.parallel.compile is compiled


@pytest.mark.parametrize(
    ("more", "compiled"),
    [
        ([], False),
        (["parallel.compile=true"], True),
        (["parallel.deepspeed.offload_param=cpu"], True),
    ],
)
def test_plan_forecasts_the_compile_a_run_with_the_parameters_on_nvme_resolves_to(
    more: list[str], compiled: bool
) -> None:
    """`zerofit plan -c` (`strategy_for`) and the planner's candidates of such a config forecast
    the step a GPU run takes: uncompiled with the parameters on NVMe under `auto`, as `resolve`
    makes it (the planner had forecast a compiled step there)."""
    keys = [f"parallel.deepspeed.{k}={v}" for k, v in NVME.items()]
    on_disk = [*keys, "parallel.deepspeed.nvme_path=/tmp", "parallel.deepspeed.offload_param=nvme"]
    cfg = load_config(None, ["parallel.backend=deepspeed", *on_disk, *more])
    assert strategy_for(cfg).compile is compiled
    hw = Hardware(gpus_per_node=2, gpu_mem=80 * 2**30, nvme=10**12)
    written = "parallel.compile=true" in more
    on_disk = [getattr(s.options, "offload_param", "") == "nvme" for s in candidates(hw, cfg)]
    assert any(on_disk)
    assert [s.compile for s in candidates(hw, cfg)] == [written or not d for d in on_disk]


@pytest.mark.slow
@pytest.mark.dist
def test_parameters_on_nvme_train_a_deep_model_under_recomputation(tmp_path: Path) -> None:
    """Eight blocks whose matrices all go to the disk, recomputed in backward: with DeepSpeed's
    reuse distance every block stayed gathered, each holding its swap buffers, and the fetch of a
    recomputed block found none ("Not enough buffers 0 for swapping 3"; an H100 run of 2.0B
    parameters failed so, with 7). One rank, two steps (the second fetches what the first's
    optimizer step wrote back): the test is bound by the disk, not the CPU."""
    why = nvme.aio_missing()
    if why:
        pytest.skip(f"DeepSpeed's async_io op cannot build here: {why}")
    (tmp_path / "ds.json").write_text(json.dumps(ALL_ON_DISK))
    (tmp_path / "ssd").mkdir()
    ds = {**NVME, "offload_param": "nvme", "nvme_path": str(tmp_path / "ssd"), "config": str(tmp_path / "ds.json")}  # fmt: skip
    deep = {"model": {"overrides": {"n_layers": 8, "ffn_dim": 2048}}, "train": {"steps": 2},
            "parallel": {"backend": "deepspeed", "activation_checkpointing": "full", "deepspeed": ds},
            "checkpoint": {"every": 0, "save_final": False}}  # fmt: skip
    run = train_run(tmp_path, "deep", deep, "--nproc", "1")
    assert len(losses(run)) == 2


def test_plan_proposes_nvme_when_gpus_and_host_ram_cannot_hold_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The 70B full fine-tune on 8 x 80 GB with 256 GiB of host RAM: nothing fits, CPU offload
    needs over a TiB of host RAM; with both on NVMe it fits, and the plan says so."""
    args = ["--preset", "70b", "--gpus", "8", "--gpu-mem", "80GB", "--cpu-mem", "256GiB"]
    assert main(["plan", *args, "--seq-len", "4096", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["recommendation"] is None
    proposal = data["nvme"]["proposal"]
    assert proposal["fits"] and "optim->nvme" in proposal["strategy"]
    # pinned, torch rounds each rank's 17.5 GB gradient partitions up to 32 GiB: 8 of them
    # leave no room, so the proposal is unpinned, and its flags say so
    assert proposal["config"]["parallel.deepspeed.pin_memory"] is False
    assert proposal["nvme_bytes_per_node"] == pytest.approx(8 * proposal["nvme_bytes_per_gpu"])
    assert proposal["host_gib_per_gpu"] * 8 <= 256 * 0.85
    assert main(["plan", *args, "--seq-len", "4096", "--nvme-bw", "12,6"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "with NVMe offload it fits: ZeRO-3 + optim->nvme" in out
    assert "12.0 GB/s read, 6.0 GB/s write (--nvme-bw)" in out
    assert "--parallel.deepspeed.nvme_path DIR" in out
    assert "--parallel.deepspeed.pin_memory False" in out


@pytest.mark.parametrize("bad", ["0", "1,2,3", "fast", "nan"])
def test_nvme_bw_must_be_positive_figures(capsys: pytest.CaptureFixture[str], bad: str) -> None:
    args = ["plan", "--preset", "tiny", "--gpus", "1", "--gpu-mem", "8GB", "--nvme-bw", bad]
    assert main(args) == 2
    assert capsys.readouterr().err.startswith("error: --nvme-bw")


def test_the_disk_probe_times_o_direct_io_and_cleans_up(tmp_path: Path) -> None:
    read, write = probe(str(tmp_path), size=16 * 2**20)
    assert read > 0 and write > 0
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------- it runs


# Wide enough that every block matrix's partition passes DeepSpeed's 1 MiB swap threshold, and
# max_in_cpu 0 (a user's DeepSpeed JSON): the parameters are read from the disk at every use.
WIDE = {"model": {"overrides": {"n_layers": 2, "ffn_dim": 2048}}}  # fmt: skip
ALL_ON_DISK = {"zero_optimization": {"offload_param": {"max_in_cpu": 0}}}


@pytest.mark.slow
@pytest.mark.dist
def test_nvme_offload_trains_as_cpu_offload_and_resumes_exactly(tmp_path: Path) -> None:
    """ZeRO-3 with the optimizer and the parameters on NVMe (DeepSpeed's async_io on its CPU
    accelerator): the same losses as both in host RAM (same fp32 AdamW, other storage), swap
    files per rank, and a resume from step 5 bit-exact to step 10 (`nvme_runtime` restores what
    DeepSpeed's own load skips). Its checkpoint cannot be read into another layout: one line."""
    why = nvme.aio_missing()
    if why:
        pytest.skip(f"DeepSpeed's async_io op cannot build here: {why}")
    (tmp_path / "ds.json").write_text(json.dumps(ALL_ON_DISK))
    swap = tmp_path / "ssd"
    swap.mkdir()
    ds = {**NVME, "offload_param": "nvme", "nvme_path": str(swap), "config": str(tmp_path / "ds.json")}  # fmt: skip
    extra = deep_update(deep_update(CKPT5, WIDE), {"parallel": {"backend": "deepspeed", "deepspeed": ds}})  # fmt: skip
    host = {"stage": 3, "offload_optimizer": "cpu", "offload_param": "cpu", "pin_memory": False}
    cpu = POOL.submit(train_run, tmp_path, "cpu", deep_update(WIDE, {"parallel": {"backend": "deepspeed", "deepspeed": host}}), "--nproc", "2")  # fmt: skip
    run = train_run(tmp_path, "nvme", extra, "--nproc", "2")
    assert losses(run) == losses(cpu.result())
    for kind in ("optimizer", "float32params"):
        for rank in (0, 1):
            assert any((swap / "zero_stage_3" / kind / f"rank{rank}").iterdir()), (kind, rank)
    model = run / "checkpoints" / "step_00000005" / "model"
    assert sorted(p.name for p in (model / "offloaded_tensors").iterdir()) == ["rank00", "rank01"]
    with pytest.raises(UserError, match="in DeepSpeed's NVMe swap files"):
        ZeroCheckpointReader(model).read_metadata()
    later = tmp_path / "resume"
    (later / "ssd").mkdir(parents=True)
    resumed = deep_update(extra, {"parallel": {"deepspeed": {"nvme_path": str(later / "ssd")}}})
    assert_resume_exact(later, run, resumed)


def test_the_nvme_prefetch_leaves_a_block_of_swap_buffers_free(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """DeepSpeed's NVMe prefetch asks for as many parameters as there are free swap buffers; a
    block recomputed off its trace then found 5 for 6 ("Not enough swap in buffers", an H100).
    The patched swap-in reads each parameter once and leaves PREFETCH_RESERVE buffers to the
    fetch in use; a fetch (synchronous) may take them all."""
    swapper = pytest.importorskip("deepspeed.runtime.swap_tensor.partitioned_param_swapper")
    from zerofit.backends.deepspeed.nvme_runtime import PREFETCH_RESERVE, dedupe_swap_ins

    asked: list[tuple[list, bool]] = []

    def record(self: object, params: list, async_op: bool = True, swap_in_buffers: object = None):
        asked.append((list(params), async_op))

    Swapper = swapper.AsyncPartitionedParameterSwapper
    monkeypatch.setattr(Swapper, "swap_in", record)
    dedupe_swap_ins()
    stub = namedtuple("Stub", "available_buffer_ids")(list(range(PREFETCH_RESERVE + 3)))
    params = [object() for _ in range(8)]
    Swapper.swap_in(stub, params + params[:2], async_op=True)
    Swapper.swap_in(stub, params, async_op=False)
    assert asked == [(params[:3], True), (params, False)]
    asked.clear()
    few = namedtuple("Stub", "available_buffer_ids")(list(range(PREFETCH_RESERVE)))
    Swapper.swap_in(few, params, async_op=True)
    assert asked == [], "no prefetch while only the reserve is free"
