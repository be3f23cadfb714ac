"""``manifest.json`` of a checkpoint (`zerofit.checkpoint.manifest`): what is written, and that
`verify` names the first missing, extra, resized, altered or non-regular file before anything is
loaded. Fast: small files in a temporary folder (the block size is shrunk where the per-block
hashes of a large file are the point; the real one is checked apart).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from zerofit.checkpoint import manifest
from zerofit.checkpoint.safe_load import UnsafeCheckpointError

BLOCK_256M = 256 * 2**20  # the documented block: `dd bs=256M skip=i count=1 | sha256sum`


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def make(root: Path, files: dict[str, bytes]) -> Path:
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return root


def seal(root: Path, step: int = 5) -> dict:
    files = manifest.hash_files(root, manifest.list_files(root))
    manifest.write_manifest(root, files, step)
    return json.loads((root / "manifest.json").read_text())


FILES = {
    "meta.json": b'{"step": 5}',
    "model/.metadata": b"\x80\x04meta",
    "model/__0_0.distcp": bytes(range(256)) * 40,
    "model/__1_0.distcp": b"",
    "rank1.json": b"{}",
}


def test_list_files_is_every_file_sorted_relative_without_the_manifest(tmp_path: Path) -> None:
    make(tmp_path, FILES)
    (tmp_path / "manifest.json").write_text("{}")
    (tmp_path / "model" / "manifest.json").write_text("{}")  # only the top one is the manifest
    assert manifest.list_files(tmp_path) == sorted([*FILES, "model/manifest.json"])


def test_a_sealed_checkpoint_records_size_and_sha256_of_each_file(tmp_path: Path) -> None:
    make(tmp_path, FILES)
    body = seal(tmp_path, step=7)
    assert body["version"] == 1 and body["block"] == BLOCK_256M and body["step"] == 7
    assert body["files"] == {rel: {"size": len(d), "sha256": sha(d)} for rel, d in FILES.items()}
    assert list(body["files"]) == sorted(FILES)
    assert not (tmp_path / "manifest.json.part").exists()
    manifest.verify(tmp_path)  # and it verifies


def test_sha256_of_a_file_and_of_a_range(tmp_path: Path) -> None:
    data = os.urandom(3000)
    (tmp_path / "f").write_bytes(data)
    assert manifest.sha256_file(tmp_path / "f") == (3000, sha(data))
    assert manifest.sha256_range(tmp_path / "f", 1000, 500) == sha(data[1000:1500])
    assert manifest.sha256_range(tmp_path / "f", 2500, 10_000) == sha(data[2500:])
    assert manifest.sha256_range(tmp_path / "f", 0, 0) == sha(b"")


@pytest.mark.parametrize("threads", [None, 1, 3])
def test_a_file_over_one_block_is_hashed_per_block(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, threads: int | None
) -> None:
    monkeypatch.setattr(manifest, "BLOCK", 1024)
    monkeypatch.setattr(manifest, "_READ", 100)  # several reads per block
    big = os.urandom(2 * 1024 + 10)
    exact = os.urandom(1024)
    make(tmp_path, {"big": big, "exact": exact, "small": b"abc", "empty": b""})
    got = manifest.hash_files(tmp_path, ["big", "exact", "small", "empty"], threads)
    assert got["big"] == {
        "size": len(big),
        "blocks": [sha(big[:1024]), sha(big[1024:2048]), sha(big[2048:])],
    }
    assert got["exact"] == {"size": 1024, "sha256": sha(exact)}  # one block: plain sha256
    assert got["small"] == {"size": 3, "sha256": sha(b"abc")}
    assert got["empty"] == {"size": 0, "sha256": sha(b"")}


def test_a_multi_block_manifest_verifies_and_a_changed_block_is_found(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(manifest, "BLOCK", 1024)
    big = bytearray(os.urandom(3 * 1024))
    make(tmp_path, {"big": bytes(big)})
    seal(tmp_path)
    manifest.verify(tmp_path, threads=2)
    big[2500] ^= 1  # the last block only, same size
    (tmp_path / "big").write_bytes(bytes(big))
    with pytest.raises(UnsafeCheckpointError, match="big does not match its SHA-256"):
        manifest.verify(tmp_path)


def test_a_manifest_with_another_block_size_is_refused(tmp_path: Path) -> None:
    make(tmp_path, {"a": b"x"})
    seal(tmp_path)
    body = json.loads((tmp_path / "manifest.json").read_text())
    body["block"] = BLOCK_256M * 2
    (tmp_path / "manifest.json").write_text(json.dumps(body))
    with pytest.raises(UnsafeCheckpointError, match=r"its hash block is 536870912 bytes, not"):
        manifest.verify(tmp_path)
    del body["block"]  # absent: the one block size there is
    (tmp_path / "manifest.json").write_text(json.dumps(body))
    manifest.verify(tmp_path)


# ----------------------------------------------------------------------------- verify refuses


def sealed(tmp_path: Path) -> Path:
    root = make(tmp_path / "step_00000005", FILES)
    seal(root)
    return root


def refused(root: Path) -> str:
    with pytest.raises(UnsafeCheckpointError) as err:
        manifest.verify(root)
    line = str(err.value)
    assert line.startswith(f"checkpoint {root}"), line
    return line


def test_a_missing_file_is_named(tmp_path: Path) -> None:
    root = sealed(tmp_path)
    (root / "model" / "__0_0.distcp").unlink()
    (root / "rank1.json").unlink()
    assert refused(root).endswith("model/__0_0.distcp is missing")  # the first, sorted


def test_an_extra_file_is_named(tmp_path: Path) -> None:
    root = sealed(tmp_path)
    (root / "model" / "evil.py").write_text("import os")
    assert refused(root).endswith("model/evil.py is not in the manifest")


def test_a_resized_file_is_named_with_both_sizes(tmp_path: Path) -> None:
    root = sealed(tmp_path)
    (root / "rank1.json").write_bytes(b"{} ")
    assert refused(root).endswith("rank1.json is 3 bytes, the manifest says 2")


@pytest.mark.parametrize("where", [0, 5119, 2000])
def test_a_changed_byte_is_found(tmp_path: Path, where: int) -> None:
    root = sealed(tmp_path)
    path = root / "model" / "__0_0.distcp"
    data = bytearray(path.read_bytes())
    data[where] ^= 0x80
    path.write_bytes(bytes(data))
    assert refused(root).endswith("model/__0_0.distcp does not match its SHA-256 in the manifest")


def test_a_symlink_in_place_of_a_file_is_refused(tmp_path: Path) -> None:
    root = sealed(tmp_path)
    target = tmp_path / "elsewhere"
    target.write_bytes(FILES["rank1.json"])  # the same bytes: still refused
    (root / "rank1.json").unlink()
    (root / "rank1.json").symlink_to(target)
    assert refused(root).endswith(
        "rank1.json is a symbolic link (a checkpoint holds its own files only)"
    )


def _other_run(tmp_path: Path) -> Path:
    """Another run's ``model/`` folder: the same file names, other bytes."""
    other = make(
        tmp_path / "other" / "model",
        {k[len("model/") :]: b"other weights" for k in FILES if k.startswith("model/")},
    )
    return other


def test_a_symlinked_folder_is_refused_even_with_a_manifest_made_for_it(tmp_path: Path) -> None:
    """Issue 27: ``model/`` replaced by a link to another run's ``model/`` and the manifest
    regenerated: the manifest never saw the files behind the link, so it vouched for nothing.
    The link is named, whatever the manifest says."""
    root = sealed(tmp_path)
    for f in (root / "model").iterdir():
        f.unlink()
    (root / "model").rmdir()
    (root / "model").symlink_to(_other_run(tmp_path), target_is_directory=True)
    seal(root)  # the tester's regenerated manifest
    assert refused(root) == (
        f"checkpoint {root}: model is a symbolic link (a checkpoint holds its own files only)"
    )


def test_a_link_anywhere_in_the_tree_is_refused(tmp_path: Path) -> None:
    root = sealed(tmp_path)
    (root / "model" / "deeper").mkdir()
    (root / "model" / "deeper" / "x").symlink_to(tmp_path / "nowhere")  # dangling: still named
    assert refused(root).endswith(
        "model/deeper/x is a symbolic link (a checkpoint holds its own files only)"
    )


def test_a_symlinked_checkpoint_folder_or_manifest_is_refused(tmp_path: Path) -> None:
    root = sealed(tmp_path)
    link = tmp_path / "step_00000006"
    link.symlink_to(root, target_is_directory=True)
    with pytest.raises(UnsafeCheckpointError, match=r"step_00000006 is a symbolic link"):
        manifest.verify(link)
    (tmp_path / "kept.json").write_bytes((root / "manifest.json").read_bytes())
    (root / "manifest.json").unlink()
    (root / "manifest.json").symlink_to(tmp_path / "kept.json")
    assert refused(root).endswith(
        "manifest.json is a symbolic link (a checkpoint holds its own files only)"
    )


def test_a_fifo_in_place_of_a_file_is_refused(tmp_path: Path) -> None:
    root = sealed(tmp_path)
    (root / "meta.json").unlink()
    os.mkfifo(root / "meta.json")
    assert refused(root).endswith("meta.json is not a regular file")


def test_a_checkpoint_without_a_manifest_is_refused(tmp_path: Path) -> None:
    root = make(tmp_path / "c", FILES)
    assert refused(root) == f"checkpoint {root} has no manifest.json (incomplete, or damaged)"
    (root / "manifest.json").mkdir()
    assert "has no manifest.json" in refused(root)


@pytest.mark.parametrize(
    "body",
    [
        "not json",
        "[]",
        "{}",
        '{"files": []}',
        '{"files": {"a": 5}}',
        '{"files": {"a": {"size": "1", "sha256": "x"}}}',
        '{"files": {"a": {"size": 1.0, "sha256": "x"}}}',
        '{"files": {"a": {"sha256": "x"}}}',
        '{"files": {"a": {"size": 1, "sha256": 5}}}',
        '{"files": {"a": {"size": 1}}}',
        '{"files": {"a": {"size": 1, "blocks": "x"}}}',
        '{"files": {"a": {"size": 1, "blocks": ["x", 5]}}}',
        '{"files": {"a": {"size": 1, "blocks": ["x"]}, "b": []}}',
        b"\xff\xfe",
    ],
)
def test_a_malformed_manifest_is_refused(tmp_path: Path, body: str | bytes) -> None:
    root = make(tmp_path / "c", {"a": b"x"})
    path = root / "manifest.json"
    path.write_bytes(body if isinstance(body, bytes) else body.encode())
    assert "manifest.json is not a valid manifest" in refused(root)


def test_well_formed_entries_are_read(tmp_path: Path) -> None:
    root = make(tmp_path / "c", {"a": b"x"})
    files = {"a": {"size": 1, "blocks": ["x", "y"]}, "b": {"size": 0, "sha256": "z"}}
    (root / "manifest.json").write_text(json.dumps({"files": files}))
    assert manifest.read_manifest(root) == files


@pytest.mark.parametrize("rel", ["/etc/passwd", "../outside", "model/../../x", "a/../../b"])
def test_a_manifest_naming_a_path_outside_is_refused(tmp_path: Path, rel: str) -> None:
    root = make(tmp_path / "c", {"a": b"x"})
    files = {"a": {"size": 1, "sha256": sha(b"x")}, rel: {"size": 1, "sha256": sha(b"x")}}
    (root / "manifest.json").write_text(json.dumps({"files": files}))
    assert refused(root).endswith(f"manifest.json names a path outside it: {rel!r}")


def test_dots_inside_names_are_not_outside(tmp_path: Path) -> None:
    root = make(tmp_path / "c", {"a..b": b"x", "model/..x": b"y"})
    seal(root)
    manifest.verify(root)


def test_a_range_read_in_small_pieces_hashes_every_byte(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(manifest, "_READ", 3)  # 10 bytes: reads of 3, 3, 3 and the last 1
    data = b"0123456789"
    (tmp_path / "f").write_bytes(data)
    assert manifest.sha256_range(tmp_path / "f", 0, 10) == sha(data)
    assert manifest.sha256_file(tmp_path / "f") == (10, sha(data))
    assert manifest.sha256_range(tmp_path / "f", 9, 1) == sha(b"9")


def test_a_checkpoint_of_no_files_hashes_and_verifies(tmp_path: Path) -> None:
    assert manifest.hash_files(tmp_path, []) == {}
    body = seal(tmp_path)
    assert body["files"] == {}
    manifest.verify(tmp_path)
