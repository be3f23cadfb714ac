"""Issue 27: a checkpoint holds what its manifest says, and its manifest what the engine reads.

`zerofit.checkpoint.verify` refuses a checkpoint that lacks a file its engine's layout writes
(`Engine.checkpoint_files`: DCP's `.metadata` and one shard per rank, DeepSpeed's model-states and
optimizer files, each rank's state) even when the manifest was regenerated to match what is there.
Fast: the files are stand-ins (only their names matter here); the shared runs of
test_checkpoint_safety check the layouts against real saves.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from zerofit.checkpoint import manifest, select_checkpoint, verify
from zerofit.errors import UnsafeCheckpointError, UserError

DCP2 = {"format": "dcp", "layout": {"world_size": 2}}
DCP_FILES = ["model/.metadata", "model/__0_0.distcp", "model/__1_0.distcp"]


def _ds(stage: int, world: int = 2) -> dict:
    return {"format": "deepspeed", "layout": {"world_size": world, "stage": stage}}


Z3_BF16 = [
    f"model/{prefix}zero_pp_rank_{r}_mp_rank_00_{kind}_states.pt"
    for r in range(2)
    for prefix, kind in (("", "model"), ("bf16_", "optim"))
]


def make(root: Path, meta: dict, model: list[str], world: int = 2) -> Path:
    """A sealed checkpoint ``step_00000003`` of ``meta``: rank states, meta.json, ``model``."""
    ckpt = root / "step_00000003"
    body = {"step": 3, "backend": "x", "world_size": world, **meta}
    for rel in [*model, *(f"rank{r}.json" for r in range(world))]:
        (ckpt / rel).parent.mkdir(parents=True, exist_ok=True)
        (ckpt / rel).write_text("{}")
    (ckpt / "meta.json").write_text(json.dumps(body))
    seal(ckpt)
    return ckpt


def seal(ckpt: Path) -> None:
    """The manifest of what is there now: what a tester who edits files regenerates."""
    manifest.write_manifest(ckpt, manifest.hash_files(ckpt, manifest.list_files(ckpt)), 3)


def refused(ckpt: Path) -> str:
    with pytest.raises(UnsafeCheckpointError) as err:
        verify(ckpt)
    line = str(err.value)
    assert line.startswith(f"checkpoint {ckpt}") and "\n" not in line, line
    return line


STATES = "model/mp_rank_00_model_states.pt"  # ZeRO-0/1/2: one file of module states
Z2 = [STATES, *(f"model/zero_pp_rank_{r}_mp_rank_00_optim_states.pt" for r in (0, 1))]


@pytest.mark.parametrize(
    ("meta", "files", "gone"),
    [
        (DCP2, DCP_FILES, "model/__1_0.distcp"),
        (DCP2, DCP_FILES, "model/.metadata"),
        (DCP2, DCP_FILES, "rank1.json"),
        (_ds(3), Z3_BF16, "model/zero_pp_rank_1_mp_rank_00_model_states.pt"),
        (_ds(3), Z3_BF16, "model/bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt"),
        (_ds(2), Z2, "model/zero_pp_rank_1_mp_rank_00_optim_states.pt"),
        (_ds(0), [STATES], STATES),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_a_file_the_layout_needs_is_named_even_with_a_regenerated_manifest(
    tmp_path: Path, meta: dict, files: list[str], gone: str
) -> None:
    ckpt = make(tmp_path, meta, files)
    assert verify(ckpt)["world_size"] == 2  # the whole layout verifies
    (ckpt / gone).unlink()
    seal(ckpt)  # the manifest no longer lists it: it verifies, but the engine would read it
    manifest.verify(ckpt)
    named = gone.replace("bf16_", "")  # a DeepSpeed optimizer file may have either name
    assert refused(ckpt) == (
        f"checkpoint {ckpt}: {named} is missing ({meta['format']} on 2 rank(s) writes it)"
    )


def test_the_whole_model_folder_gone_is_named(tmp_path: Path) -> None:
    ckpt = make(tmp_path, DCP2, DCP_FILES)
    for rel in DCP_FILES:
        (ckpt / rel).unlink()
    (ckpt / "model").rmdir()
    seal(ckpt)
    assert refused(ckpt).endswith("model/.metadata is missing (dcp on 2 rank(s) writes it)")


@pytest.mark.parametrize(
    ("meta", "why"),
    [
        ({"format": "tarball"}, "meta.json has an unknown format 'tarball'"),
        ({"format": "deepspeed", "layout": {"stage": 7}}, "no ZeRO stage in its layout (7)"),
        ({"format": "deepspeed", "layout": None}, "no ZeRO stage in its layout (None)"),
        ({"format": "dcp", "world_size": 0}, "meta.json has a bad world_size: 0"),
    ],
    ids=["format", "stage", "layout", "world"],
)
def test_a_meta_no_engine_writes_is_refused(tmp_path: Path, meta: dict, why: str) -> None:
    ckpt = make(tmp_path, meta, DCP_FILES)
    assert why in refused(ckpt)


def test_resume_skips_a_checkpoint_missing_a_file_and_takes_the_older_one(tmp_path: Path) -> None:
    older = make(tmp_path / "a", DCP2, DCP_FILES)
    newer = make(tmp_path / "b", DCP2, DCP_FILES)
    root = tmp_path / "root"
    root.mkdir()
    older.rename(root / "step_00000003")
    meta = json.loads((newer / "meta.json").read_text())
    (newer / "meta.json").write_text(json.dumps({**meta, "step": 4}))
    (newer / "model" / "__0_0.distcp").unlink()
    seal(newer)
    newer.rename(root / "step_00000004")
    ckpt, _, skipped = select_checkpoint(root)
    assert ckpt == root / "step_00000003"
    assert skipped == [
        "skipping damaged checkpoint step_00000004: model/__0_0.distcp is missing "
        "(dcp on 2 rank(s) writes it)"
    ]


def test_every_engine_declares_its_files() -> None:
    """The registry asks the engine that writes a format (the engine-neutral code never names one)."""
    from zerofit.backends import checkpoint_files  # here: the rest of the file is the old API's

    dcp = list(checkpoint_files({"format": "dcp", "world_size": 1}) or [])
    assert dcp == [(".metadata",), ("__0_0.distcp",)]
    z1 = list(checkpoint_files({**_ds(1, 1), "world_size": 1}) or [])
    assert z1 == [
        ("mp_rank_00_model_states.pt",),
        (
            "zero_pp_rank_0_mp_rank_00_optim_states.pt",
            "bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt",
        ),
    ]
    assert checkpoint_files({"format": "zip"}) is None
    with pytest.raises(UserError):
        verify(Path("/nonexistent/step_00000001"))
