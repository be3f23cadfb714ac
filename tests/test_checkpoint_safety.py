"""Checkpoints are safe to load and damage is caught: nothing in a checkpoint runs on load, every
byte is checked against the manifest first, and every failure is one line naming the file."""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import shutil
import zipfile
from pathlib import Path

import pytest
import torch
from conftest import deep_update, losses, train_run, write_config, zerofit

from zerofit.checkpoint import manifest, select_checkpoint, verify
from zerofit.checkpoint.safe_load import load_dcp_metadata
from zerofit.errors import UserError

pytestmark = pytest.mark.dist

ENGINES = {
    "fsdp": ({"parallel": {"backend": "fsdp"}}, 2),
    "z3": ({"parallel": {"backend": "deepspeed", "deepspeed": {"stage": 3}}}, 2),
    "z1": ({"parallel": {"backend": "deepspeed", "deepspeed": {"stage": 1}}}, 2),
}
BASE = {"train": {"steps": 3}, "checkpoint": {"every": 1, "keep_last": 3}}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("safety")
    return {
        name: train_run(tmp, name, deep_update(BASE, extra), "--nproc", str(n))
        for name, (extra, n) in ENGINES.items()
    }


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


def fresh_copy(run: Path, tmp: Path, step: int = 3) -> tuple[Path, Path]:
    ckpt = run / "checkpoints" / f"step_{step:08d}"
    dest = tmp / "run"
    shutil.copytree(ckpt, dest / "checkpoints" / ckpt.name)
    return dest, dest / "checkpoints" / ckpt.name


def resume(tmp: Path, run: Path, engine: str, target: str | None = None, *extra: str):
    extra_cfg, n = ENGINES[target or engine]
    cfg = write_config(
        tmp / "c.yaml", deep_update(deep_update(BASE, extra_cfg), {"log": {"run_dir": str(run)}})
    )
    return zerofit(
        "train", "-c", str(cfg), "--nproc", str(n), "--train.steps", "4", *extra, cwd=tmp
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


@pytest.mark.parametrize(
    ("engine", "rel", "target"), CASES, ids=[f"{e}:{r}>{t or e}" for e, r, t in CASES]
)
def test_payloads_never_run(
    runs, tmp_path: Path, engine: str, rel: str, target: str | None
) -> None:  # noqa: ANN001
    run, ckpt = fresh_copy(runs[engine], tmp_path)
    marker = tmp_path / "PWNED"
    plant(ckpt / rel, marker)
    rehash(ckpt)  # so the loader itself must refuse, not just the manifest
    proc = resume(tmp_path, run, engine, target, "--resume", str(ckpt))
    assert not marker.exists(), "a payload in the checkpoint ran"
    assert_one_line_error(proc, ckpt.name)


def test_scripts_beside_a_checkpoint_never_run(runs, tmp_path: Path) -> None:  # noqa: ANN001
    run, ckpt = fresh_copy(runs["z3"], tmp_path)
    marker = tmp_path / "PWNED"
    plant(ckpt / "zero_to_fp32.py", marker)
    rehash(ckpt)
    proc = resume(tmp_path, run, "z3", None, "--resume", str(ckpt))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert not marker.exists()


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


@pytest.mark.parametrize("kind", list(DAMAGE))
def test_damage_is_named(runs, tmp_path: Path, kind: str) -> None:  # noqa: ANN001
    rel, damage = DAMAGE[kind]
    _, ckpt = fresh_copy(runs["fsdp"], tmp_path)
    damage(ckpt / rel)
    with pytest.raises(UserError) as e:
        verify(ckpt)
    assert rel in str(e.value) and str(ckpt) in str(e.value)


def test_deleted_manifest_and_bad_manifest(runs, tmp_path: Path) -> None:  # noqa: ANN001
    _, ckpt = fresh_copy(runs["fsdp"], tmp_path)
    (ckpt / "manifest.json").write_text("not json")
    with pytest.raises(UserError, match="manifest.json is not a valid manifest"):
        verify(ckpt)
    (ckpt / "manifest.json").unlink()
    with pytest.raises(UserError, match="has no manifest.json"):
        verify(ckpt)


def test_meta_checked_even_when_manifest_is_forged(runs, tmp_path: Path) -> None:  # noqa: ANN001
    _, ckpt = fresh_copy(runs["fsdp"], tmp_path)
    (ckpt / "meta.json").write_text(
        json.dumps({"backend": "fsdp", "format": "dcp", "world_size": 2})
    )
    rehash(ckpt)
    with pytest.raises(UserError, match="meta.json lacks"):
        verify(ckpt)


def test_resume_skips_a_damaged_newest_checkpoint_by_name(runs, tmp_path: Path) -> None:  # noqa: ANN001
    src = runs["fsdp"]
    run = tmp_path / "run"
    shutil.copytree(src, run)
    (run / "config.yaml").unlink()
    newest = run / "checkpoints" / "step_00000003"
    (newest / "meta.json").unlink()
    assert select_checkpoint(run / "checkpoints")[0].name == "step_00000002"
    proc = resume(tmp_path, run, "fsdp", None, "--resume")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "skipping damaged checkpoint step_00000003" in proc.stderr
    assert "train.steps 3 -> 4: the cosine schedule is re-stretched to end at step 4" in proc.stderr
    assert "resuming from" in proc.stderr and "step_00000002" in proc.stderr
    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == sorted(set(steps)) == [1, 2, 3, 4]  # one record per step
    assert (run / "metrics.abandoned.jsonl").is_file()
    assert losses(run)[3] == pytest.approx(losses(src)[3], rel=1e-6)  # step 3 re-run exactly


def test_an_error_on_rank_1_reaches_the_user(runs, tmp_path: Path) -> None:  # noqa: ANN001
    run, ckpt = fresh_copy(runs["fsdp"], tmp_path)
    (ckpt / "rank1.json").write_text(json.dumps({"data": {}}))
    rehash(ckpt)  # passes the manifest; only rank 1 finds its state incomplete
    proc = resume(tmp_path, run, "fsdp", None, "--resume", str(ckpt))
    assert_one_line_error(proc, "rank1.json")


def test_no_ranks_state_is_needed_beyond_its_own_sha(tmp_path: Path) -> None:
    """The manifest's hashes are plain SHA-256 of each file (checkable with sha256sum)."""
    f = tmp_path / "x.bin"
    f.write_bytes(os.urandom(20_000_000))
    assert manifest.sha256_file(f) == (20_000_000, hashlib.sha256(f.read_bytes()).hexdigest())


def test_export_refuses_a_planted_payload(runs, tmp_path: Path) -> None:  # noqa: ANN001
    run = tmp_path / "run"
    shutil.copytree(runs["z3"], run)
    ckpt = run / "checkpoints" / "step_00000003"
    marker = tmp_path / "PWNED"
    plant(ckpt / "model" / "zero_pp_rank_0_mp_rank_00_optim_states.pt", marker)
    rehash(ckpt)
    proc = zerofit("export", str(run), "--out", str(tmp_path / "hf"), cwd=tmp_path)
    assert not marker.exists()
    assert_one_line_error(proc, "zero_pp_rank_0_mp_rank_00_optim_states.pt")
    assert not (tmp_path / "hf").exists()


def test_meta_step_must_match_the_directory(runs, tmp_path: Path) -> None:  # noqa: ANN001
    _, ckpt = fresh_copy(runs["fsdp"], tmp_path)
    meta = json.loads((ckpt / "meta.json").read_text())
    (ckpt / "meta.json").write_text(json.dumps({**meta, "step": 1}))
    rehash(ckpt)
    with pytest.raises(UserError, match="meta.json says step 1, the directory step 3"):
        verify(ckpt)


def test_a_symlink_or_fifo_is_never_read(runs, tmp_path: Path) -> None:  # noqa: ANN001
    _, ckpt = fresh_copy(runs["fsdp"], tmp_path)
    target = ckpt / "model" / "__1_0.distcp"
    target.rename(tmp_path / "elsewhere")
    target.symlink_to(tmp_path / "elsewhere")  # same bytes, but not a file of the checkpoint
    with pytest.raises(UserError, match="__1_0.distcp is not a regular file"):
        verify(ckpt)
    target.unlink()
    os.mkfifo(target)  # reading it would block forever
    with pytest.raises(UserError, match="__1_0.distcp"):
        verify(ckpt)
