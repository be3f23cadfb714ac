"""Checkpoints are safe to load and damage is caught: nothing in a checkpoint runs on load, every
byte is checked against the manifest first, and every failure is one line naming the file."""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import shutil
import subprocess
import zipfile
from collections.abc import Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from conftest import (
    POOL,
    SHARED,
    deep_update,
    losses,
    shared_extra,
    wait_all,
    write_config,
    zerofit,
)

from zerofit.checkpoint import manifest, select_checkpoint, verify
from zerofit.checkpoint.safe_load import load_dcp_metadata
from zerofit.errors import UserError

pytestmark = pytest.mark.dist

# Each engine's checkpoints are those of conftest's shared 10-step runs (steps 5 and 10); the tests
# damage copies of them.
ENGINES = {"fsdp": "fsdp@2", "z3": "zero3@2", "z1": "zero1@2"}
LAST = 10  # the newest checkpoint's step


@pytest.fixture(scope="module")
def runs(shared_run) -> dict[str, Path]:  # noqa: ANN001
    shared_run.start(*ENGINES.values())  # together, in the background
    return {name: shared_run(layout) for name, layout in ENGINES.items()}


class Payload:
    """Unpickling this runs a shell command that creates a marker file."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):  # noqa: ANN204
        return (os.system, (f"touch {self.marker}",))


def rehash(ckpt: Path) -> None:
    """Rewrite the manifest to match the files, as an attacker who edits it too would."""
    files = manifest.hash_files(ckpt, manifest.list_files(ckpt))
    manifest.write_manifest(ckpt, files, json.loads((ckpt / "manifest.json").read_text())["step"])


def plant(path: Path, marker: Path) -> None:
    """Replace a checkpoint file by one whose loading would run the payload, in its own format."""
    if path.name == ".metadata":
        path.write_bytes(pickle.dumps(Payload(marker)))
    elif path.suffix == ".distcp":  # every stored item becomes a torch.save'd payload
        meta_path = path.parent / ".metadata"
        meta = load_dcp_metadata(meta_path)
        blob = _torch_blob(Payload(marker))
        out, offset = bytearray(), 0
        for info in meta.storage_data.values():
            if str(info.relative_path) == path.name:
                info.offset, info.length = offset, len(blob)
                out += blob
                offset += len(blob)
        path.write_bytes(bytes(out))
        with open(meta_path, "wb") as f:
            pickle.dump(meta, f)
    elif zipfile.is_zipfile(path):  # DeepSpeed's torch.save files
        path.write_bytes(_torch_blob({"optimizer_state_dict": Payload(marker)}))
    else:  # JSON and scripts: text that would run if anything executed it
        path.write_text(f"__import__('os').system('touch {marker}')")


def _torch_blob(obj: object) -> bytes:
    import io

    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def fresh_copy(run: Path, tmp: Path, step: int = LAST) -> tuple[Path, Path]:
    ckpt = run / "checkpoints" / f"step_{step:08d}"
    dest = tmp / "run"
    shutil.copytree(ckpt, dest / "checkpoints" / ckpt.name)
    return dest, dest / "checkpoints" / ckpt.name


def resume(tmp: Path, run: Path, engine: str, target: str | None = None, *extra: str):
    """`zerofit train --resume ...` of ``run`` with the layout of ``target`` (default: its own),
    one step past the end of the shared runs."""
    layout = ENGINES[target or engine]
    cfg = write_config(
        tmp / "c.yaml", deep_update(shared_extra(layout), {"log": {"run_dir": str(run)}})
    )
    steps = ("--train.steps", str(LAST + 1))
    return zerofit(
        "train", "-c", str(cfg), "--nproc", str(SHARED[layout][1]), *steps, *extra, cwd=tmp
    )


def assert_one_line_error(proc, *needles: str) -> str:  # noqa: ANN001
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error"), proc.stderr[-3000:]
    for n in needles:
        assert n in last, last
    return last


CASES = [  # (engine whose checkpoint, file, engine that resumes it)
    ("fsdp", "model/.metadata", None),
    ("fsdp", "model/__1_0.distcp", None),
    ("fsdp", "model/__0_0.distcp", "z3"),
    ("z3", "model/zero_pp_rank_0_mp_rank_00_optim_states.pt", None),  # DeepSpeed's own loader
    ("z3", "model/zero_pp_rank_1_mp_rank_00_model_states.pt", None),
    ("z3", "model/zero_pp_rank_1_mp_rank_00_optim_states.pt", "fsdp"),  # the neutral reader
    ("z1", "model/mp_rank_00_model_states.pt", None),
    ("z1", "model/zero_pp_rank_1_mp_rank_00_optim_states.pt", "fsdp"),
    ("z1", "rank1.json", None),
    ("fsdp", "meta.json", None),
]


@dataclass
class Launch:
    """A `zerofit` command on a prepared copy of a shared run, started in the background."""

    tmp: Path  # the launch's own directory
    run: Path  # the run directory it continues (or exports)
    ckpt: Path  # the checkpoint it loads
    future: Future[subprocess.CompletedProcess]

    @property
    def marker(self) -> Path:  # a planted payload creates this file if it ever runs
        return self.tmp / "PWNED"

    def proc(self) -> subprocess.CompletedProcess:
        return self.future.result()


def _payload(runs: dict[str, Path], tmp: Path, engine: str, rel: str, target: str | None) -> Launch:
    run, ckpt = fresh_copy(runs[engine], tmp)
    plant(ckpt / rel, tmp / "PWNED")
    rehash(ckpt)  # so the loader itself must refuse, not just the manifest
    return Launch(
        tmp, run, ckpt, POOL.submit(resume, tmp, run, engine, target, "--resume", str(ckpt))
    )


def _script_beside(runs: dict[str, Path], tmp: Path) -> Launch:
    run, ckpt = fresh_copy(runs["z3"], tmp)
    plant(ckpt / "zero_to_fp32.py", tmp / "PWNED")
    rehash(ckpt)
    return Launch(tmp, run, ckpt, POOL.submit(resume, tmp, run, "z3", None, "--resume", str(ckpt)))


def _damaged_newest(runs: dict[str, Path], tmp: Path) -> Launch:
    run = tmp / "run"
    shutil.copytree(runs["fsdp"], run)
    (run / "config.yaml").unlink()
    newest = run / "checkpoints" / f"step_{LAST:08d}"
    (newest / "meta.json").unlink()
    # what --resume takes, before the launch saves anew
    ckpt = select_checkpoint(run / "checkpoints")[0]
    return Launch(tmp, run, ckpt, POOL.submit(resume, tmp, run, "fsdp", None, "--resume"))


def _rank1_incomplete(runs: dict[str, Path], tmp: Path) -> Launch:
    run, ckpt = fresh_copy(runs["fsdp"], tmp)
    (ckpt / "rank1.json").write_text(json.dumps({"data": {}}))
    rehash(ckpt)  # passes the manifest; only rank 1 finds its state incomplete
    return Launch(
        tmp, run, ckpt, POOL.submit(resume, tmp, run, "fsdp", None, "--resume", str(ckpt))
    )


def _export_payload(runs: dict[str, Path], tmp: Path) -> Launch:
    run = tmp / "run"
    shutil.copytree(runs["z3"], run)
    ckpt = run / "checkpoints" / f"step_{LAST:08d}"
    plant(ckpt / "model" / "zero_pp_rank_0_mp_rank_00_optim_states.pt", tmp / "PWNED")
    rehash(ckpt)
    export = POOL.submit(zerofit, "export", str(run), "--out", str(tmp / "hf"), cwd=tmp)
    return Launch(tmp, run, ckpt, export)


@pytest.fixture(scope="module")
def launches(runs, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:  # noqa: ANN001
    """Every test below that runs `zerofit train --resume` or `zerofit export` on a damaged or
    planted copy: each copy prepared here, all the launches started together in the background
    (two at a time); each test checks its own."""
    out: dict = {}
    for case in CASES:
        out[case] = _payload(runs, tmp_path_factory.mktemp("payload"), *case)
    for name, prepare in (
        ("script beside", _script_beside),
        ("damaged newest", _damaged_newest),
        ("rank 1 incomplete", _rank1_incomplete),
        ("export payload", _export_payload),
    ):
        out[name] = prepare(runs, tmp_path_factory.mktemp(name.replace(" ", "-")))
    yield out
    wait_all(launch.future for launch in out.values())


@pytest.mark.slow
@pytest.mark.parametrize(
    ("engine", "rel", "target"), CASES, ids=[f"{e}:{r}>{t or e}" for e, r, t in CASES]
)
def test_payloads_never_run(launches, engine: str, rel: str, target: str | None) -> None:  # noqa: ANN001
    launch = launches[(engine, rel, target)]
    proc = launch.proc()
    assert not launch.marker.exists(), "a payload in the checkpoint ran"
    assert_one_line_error(proc, launch.ckpt.name)


@pytest.mark.slow
def test_scripts_beside_a_checkpoint_never_run(launches) -> None:  # noqa: ANN001
    launch = launches["script beside"]
    proc = launch.proc()
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert not launch.marker.exists()


def _truncate(p: Path) -> None:
    p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])


def _zeros(p: Path) -> None:
    data = bytearray(p.read_bytes())
    data[4096:8192] = bytes(4096)
    p.write_bytes(bytes(data))


DAMAGE = {
    "truncated distcp": ("model/__0_0.distcp", _truncate),
    "deleted distcp": ("model/__1_0.distcp", Path.unlink),
    "zeros in distcp": ("model/__1_0.distcp", _zeros),
    "deleted metadata": ("model/.metadata", Path.unlink),
    "truncated metadata": ("model/.metadata", _truncate),
    "truncated rank state": ("rank0.json", _truncate),
    "deleted rank state": ("rank1.json", Path.unlink),
    "meta not json": ("meta.json", lambda p: p.write_text("{step: 3")),
    "meta without step": ("meta.json", lambda p: p.write_text(json.dumps({"backend": "fsdp"}))),
    "extra file": ("model/__2_0.distcp", lambda p: p.write_bytes(b"x")),
}


@pytest.mark.slow
@pytest.mark.parametrize("kind", list(DAMAGE))
def test_damage_is_named(runs, tmp_path: Path, kind: str) -> None:  # noqa: ANN001
    rel, damage = DAMAGE[kind]
    _, ckpt = fresh_copy(runs["fsdp"], tmp_path)
    damage(ckpt / rel)
    with pytest.raises(UserError) as e:
        verify(ckpt)
    assert rel in str(e.value) and str(ckpt) in str(e.value)


@pytest.mark.slow
def test_deleted_manifest_and_bad_manifest(runs, tmp_path: Path) -> None:  # noqa: ANN001
    _, ckpt = fresh_copy(runs["fsdp"], tmp_path)
    (ckpt / "manifest.json").write_text("not json")
    with pytest.raises(UserError, match="manifest.json is not a valid manifest"):
        verify(ckpt)
    (ckpt / "manifest.json").unlink()
    with pytest.raises(UserError, match="has no manifest.json"):
        verify(ckpt)


@pytest.mark.slow
def test_meta_checked_even_when_manifest_is_forged(runs, tmp_path: Path) -> None:  # noqa: ANN001
    _, ckpt = fresh_copy(runs["fsdp"], tmp_path)
    (ckpt / "meta.json").write_text(
        json.dumps({"backend": "fsdp", "format": "dcp", "world_size": 2})
    )
    rehash(ckpt)
    with pytest.raises(UserError, match="meta.json lacks"):
        verify(ckpt)


@pytest.mark.slow
def test_resume_skips_a_damaged_newest_checkpoint_by_name(runs, launches) -> None:  # noqa: ANN001
    launch = launches["damaged newest"]  # step 10's meta.json deleted, config.yaml too
    src, run = runs["fsdp"], launch.run
    assert launch.ckpt.name == "step_00000005"  # select_checkpoint, before the launch
    proc = launch.proc()
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"skipping damaged checkpoint step_{LAST:08d}" in proc.stderr
    assert (
        f"train.steps {LAST} -> {LAST + 1}: the cosine schedule is re-stretched to end at step "
        f"{LAST + 1}" in proc.stderr
    )
    assert "resuming from" in proc.stderr and "step_00000005" in proc.stderr
    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == sorted(set(steps)) == list(range(1, LAST + 2))  # one record per step
    assert (run / "metrics.abandoned.jsonl").is_file()
    assert losses(run)[6] == pytest.approx(losses(src)[6], rel=1e-6)  # step 6 re-run exactly


@pytest.mark.slow
def test_an_error_on_rank_1_reaches_the_user(launches) -> None:  # noqa: ANN001
    assert_one_line_error(launches["rank 1 incomplete"].proc(), "rank1.json")


def test_no_ranks_state_is_needed_beyond_its_own_sha(tmp_path: Path) -> None:
    """The manifest's hashes are plain SHA-256 of each file (checkable with sha256sum)."""
    f = tmp_path / "x.bin"
    f.write_bytes(os.urandom(20_000_000))
    assert manifest.sha256_file(f) == (20_000_000, hashlib.sha256(f.read_bytes()).hexdigest())


@pytest.mark.slow
def test_export_refuses_a_planted_payload(launches) -> None:  # noqa: ANN001
    launch = launches["export payload"]
    proc = launch.proc()
    assert not launch.marker.exists()
    assert_one_line_error(proc, "zero_pp_rank_0_mp_rank_00_optim_states.pt")
    assert not (launch.tmp / "hf").exists()


@pytest.mark.slow
def test_meta_step_must_match_the_directory(runs, tmp_path: Path) -> None:  # noqa: ANN001
    _, ckpt = fresh_copy(runs["fsdp"], tmp_path)
    meta = json.loads((ckpt / "meta.json").read_text())
    (ckpt / "meta.json").write_text(json.dumps({**meta, "step": 1}))
    rehash(ckpt)
    with pytest.raises(UserError, match=f"meta.json says step 1, the directory step {LAST}"):
        verify(ckpt)


@pytest.mark.slow
def test_a_symlink_or_fifo_is_never_read(runs, tmp_path: Path) -> None:  # noqa: ANN001
    _, ckpt = fresh_copy(runs["fsdp"], tmp_path)
    target = ckpt / "model" / "__1_0.distcp"
    target.rename(tmp_path / "elsewhere")
    target.symlink_to(tmp_path / "elsewhere")  # same bytes, but not a file of the checkpoint
    with pytest.raises(UserError, match="__1_0.distcp is a symbolic link"):
        verify(ckpt)
    target.unlink()
    os.mkfifo(target)  # reading it would block forever
    with pytest.raises(UserError, match="__1_0.distcp"):
        verify(ckpt)
