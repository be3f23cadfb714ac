"""The checkpoint readers' allowlists, branch by branch (`zerofit.checkpoint.safe_load`).

`load_dcp_metadata` unpickles DCP's ``.metadata`` through `_MetadataUnpickler`, whose `find_class`
has three ways to say yes: (1) an exact (module, name) pair of `_DCP_CLASSES`, (2) a torch dtype
by name, (3) ``torch.serialization._get_layout`` (answered by a lookup of known layouts). For each,
a hand-made pickle names a global right next to an allowed one (``torch.save`` beside the dtypes,
``torch.serialization.save`` beside ``_get_layout``, ``pathlib.Path.write_text`` beside
``pathlib.PosixPath``, ...) and calls it with arguments whose effect would be visible (a file
written). Each must be refused with a line naming it, and the file must not exist: the refusal
comes before anything runs. A real DCP checkpoint's metadata, and one using every allowed class,
still loads. `load_torch_file` (``torch.load(weights_only=True)`` plus the classes a caller
allows) and `SafeFileSystemReader` (no pickled items) are held to the same.
"""

from __future__ import annotations

import collections
import io
import os
import pickle
import warnings
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.metadata import (
    BytesStorageMetadata,
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    StorageMeta,
    TensorProperties,
    TensorStorageMetadata,
)

from zerofit.checkpoint.neutral import checkpoint_error
from zerofit.checkpoint.safe_load import (
    SafeFileSystemReader,
    UnsafeCheckpointError,
    load_dcp_metadata,
    load_torch_file,
)
from zerofit.errors import DamagedFile

# ----------------------------------------------------------------------------- hand-made pickles


@dataclass(frozen=True)
class Call:
    """``module.name(*args)`` in a pickle (GLOBAL + REDUCE): what a hostile file asks for."""

    module: str
    name: str
    args: tuple = ()


def _enc(v: object) -> bytes:
    if isinstance(v, Call):
        head = b"c" + v.module.encode() + b"\n" + v.name.encode() + b"\n"
        return head + _enc(tuple(v.args)) + b"R"
    if isinstance(v, str):
        raw = v.encode()
        return b"X" + len(raw).to_bytes(4, "little") + raw
    if v is None:
        return b"N"
    if isinstance(v, bool):
        return b"\x88" if v else b"\x89"
    if isinstance(v, int):
        return b"J" + v.to_bytes(4, "little", signed=True)
    if isinstance(v, tuple):
        return b"(" + b"".join(_enc(x) for x in v) + b"t"
    if isinstance(v, list):
        return b"](" + b"".join(_enc(x) for x in v) + b"e"
    raise TypeError(v)


def dumps(v: object) -> bytes:
    """Protocol 4 (dotted names resolve, as in any pickle a file may hold)."""
    return b"\x80\x04" + _enc(v) + b"."


def plant_marker(path: str) -> None:
    """A module-level callable of this test: what would run if the allowlist let it."""
    Path(path).write_text("ran")


def payloads(marker: Path) -> list[tuple[str, str, tuple]]:
    """(module, name, args): each call, if it ran, leaves ``marker`` behind (or would do harm)."""
    m = str(marker)
    touch = (f"touch {m}",)
    code = (f"open({m!r}, 'w').close()",)
    return [
        # beside the dtypes and torch.Size (module 'torch'):
        ("torch", "save", ("payload", m)),
        ("torch", "load", (m,)),
        ("torch", "from_file", (m, True, 8)),
        ("torch", "hub.load", ("attacker/repo", "model")),
        ("torch", "_C._set_print_stack_traces_on_fatal_signal", (True,)),
        ("torch", "Size.__class__", ()),  # an attribute of an allowed class, not the class
        ("torch", "float32.__reduce_ex__", (2,)),
        ("torch", "serialization.save", ("payload", m)),
        ("torch.hub", "load", ("attacker/repo", "model")),
        ("torch.hub", "download_url_to_file", ("http://127.0.0.1:9/x", m)),
        # beside _get_layout (module 'torch.serialization'):
        ("torch.serialization", "save", ("payload", m)),
        ("torch.serialization", "load", (m,)),
        ("torch.serialization", "_load", (m,)),
        ("torch.serialization", "_get_layout.__globals__", ()),
        ("torch._C", "_set_print_stack_traces_on_fatal_signal", (True,)),
        ("torch._utils", "_rebuild_tensor", ()),
        # beside DCP's dataclasses (their modules import os):
        ("torch.distributed.checkpoint.metadata", "os.system", touch),
        ("torch.distributed.checkpoint.filesystem", "os.system", touch),
        ("torch.distributed.checkpoint.filesystem", "FileSystemWriter", (m,)),
        ("torch.distributed.checkpoint.filesystem", "_StorageInfo.__init__", ()),
        ("torch.distributed.checkpoint.metadata", "Metadata.__setattr__", ()),
        # beside pathlib's paths and collections.OrderedDict:
        ("pathlib", "os.system", touch),
        ("pathlib", "Path.write_text", (Call("pathlib", "PosixPath", (m,)), "ran")),
        ("pathlib", "PosixPath.touch", (Call("pathlib", "PosixPath", (m,)),)),
        ("pathlib", "Path", (m,)),
        ("collections", "namedtuple", ("T", "a b")),
        ("collections", "_sys.modules", ()),
        ("collections", "OrderedDict.fromkeys", (["a"],)),
        # the classics:
        ("os", "system", touch),
        ("posix", "system", touch),
        ("builtins", "eval", code),
        ("builtins", "exec", code),
        ("builtins", "getattr", (Call("builtins", "__import__", ("os",)), "system")),
        ("builtins", "open", (m, "w")),
        ("subprocess", "check_call", (["touch", m],)),
        ("subprocess", "Popen", (["touch", m],)),
        (__name__, "plant_marker", (m,)),
    ]


def _ids(marker: Path = Path("M")) -> list[str]:
    return [f"{mod}.{name}" for mod, name, _ in payloads(marker)]


@pytest.mark.parametrize("index", range(len(_ids())), ids=_ids())
def test_metadata_naming_a_global_beside_the_allowed_ones_is_refused_before_it_runs(
    tmp_path: Path, index: int
) -> None:
    marker = tmp_path / "PWNED"
    module, name, args = payloads(marker)[index]
    path = tmp_path / ".metadata"
    path.write_bytes(dumps(Call(module, name, args)))
    with pytest.raises(UnsafeCheckpointError) as err:
        load_dcp_metadata(path)
    line = str(err.value)
    assert line == f"{path} refused: it names {module}.{name}, which a checkpoint never needs"
    assert not marker.exists(), f"{module}.{name} ran while the metadata was read"


def test_a_payload_after_allowed_globals_is_still_refused(tmp_path: Path) -> None:
    """Allowed classes first (a dtype, a Size, a path), then torch.save: nothing may run."""
    marker = tmp_path / "PWNED"
    path = tmp_path / ".metadata"
    path.write_bytes(
        dumps(
            (
                Call("torch", "Size", ([2, 3],)),
                Call("pathlib", "PosixPath", ("x",)),
                Call("torch.serialization", "_get_layout", ("torch.strided",)),
                Call("torch", "save", ("payload", str(marker))),
            )
        )
    )
    with pytest.raises(UnsafeCheckpointError, match=r"it names torch\.save, which"):
        load_dcp_metadata(path)
    assert not marker.exists()


def test_a_pickled_class_instance_is_refused_before_its_reduce_runs(tmp_path: Path) -> None:
    marker = tmp_path / "PWNED"

    class Payload:
        def __reduce__(self):  # noqa: ANN204
            return (os.system, (f"touch {marker}",))

    path = tmp_path / ".metadata"
    path.write_bytes(pickle.dumps(Payload()))
    with pytest.raises(UnsafeCheckpointError, match=r"it names posix\.system, which"):
        load_dcp_metadata(path)
    assert not marker.exists()


@pytest.mark.parametrize("name", ["torch.evil", "strided", "torch.float32", "", "torch.strided "])
def test_an_unknown_layout_name_is_refused(tmp_path: Path, name: str) -> None:
    path = tmp_path / ".metadata"
    path.write_bytes(dumps(Call("torch.serialization", "_get_layout", (name,))))
    with pytest.raises(UnsafeCheckpointError, match="unknown tensor layout"):
        load_dcp_metadata(path)


@pytest.mark.parametrize(
    "value",
    [
        collections.OrderedDict(a=1),
        torch.float32,
        torch.Size([1]),
        torch.strided,
        PurePosixPath("x"),
        [1, 2],
        None,
        "Metadata",
    ],
    ids=repr,
)
def test_allowed_globals_that_make_no_metadata_are_refused(tmp_path: Path, value: object) -> None:
    path = tmp_path / ".metadata"
    path.write_bytes(pickle.dumps(value))
    with pytest.raises(UnsafeCheckpointError, match="refused: not a checkpoint metadata record"):
        load_dcp_metadata(path)


@pytest.mark.parametrize(
    "raw",
    [b"", b"\x80\x04", b"not a pickle", b"\x80\x04X\xff\xff\xff\x7f", dumps(Call("os", "nope"))],
)
def test_damaged_metadata_is_one_line(tmp_path: Path, raw: bytes) -> None:
    path = tmp_path / ".metadata"
    path.write_bytes(raw)
    with pytest.raises(UnsafeCheckpointError, match=f"^{path} refused: ") as err:
        load_dcp_metadata(path)
    assert "\n" not in str(err.value) and len(str(err.value)) < len(str(path)) + 320


def test_missing_metadata_is_cannot_read(tmp_path: Path) -> None:
    path = tmp_path / "nope" / ".metadata"
    with pytest.raises(
        UnsafeCheckpointError, match=r"could not be read: No such file or directory"
    ):
        load_dcp_metadata(path)


def test_long_reasons_are_cut_to_their_first_sentence(tmp_path: Path) -> None:
    name = "x" * 1000
    path = tmp_path / ".metadata"
    path.write_bytes(dumps(Call("os", name)))
    with pytest.raises(UnsafeCheckpointError) as err:
        load_dcp_metadata(path)
    line = str(err.value)  # issue 27: one line of about 200 characters, whatever the reason
    assert line.startswith(f"{path} refused: it names os.xxx") and line.endswith("x...")
    assert len(line) == max(200, len(f"{path} ") + 80)


# ----------------------------------------------------------------------------- allowed: loads


def _save_dcp(folder: Path, state: dict) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(state, checkpoint_id=folder, no_dist=True)


def _load_dcp(folder: Path, state: dict) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.load(state, storage_reader=SafeFileSystemReader(folder), no_dist=True)


def test_a_real_dcp_checkpoint_loads_through_the_allowlist(tmp_path: Path) -> None:
    w = torch.arange(6.0).reshape(2, 3)
    b = torch.tensor([1.5, -2.0], dtype=torch.bfloat16)
    _save_dcp(tmp_path, {"w": w, "b": b})
    meta = load_dcp_metadata(tmp_path / ".metadata")
    assert isinstance(meta, Metadata)
    sd = meta.state_dict_metadata
    assert sd["w"].size == torch.Size([2, 3]) and sd["w"].properties.dtype == torch.float32
    assert sd["b"].properties.dtype == torch.bfloat16
    assert sd["w"].properties.layout == torch.strided
    state = {"w": torch.zeros(2, 3), "b": torch.zeros(2, dtype=torch.bfloat16)}
    _load_dcp(tmp_path, state)
    assert torch.equal(state["w"], w) and torch.equal(state["b"], b)


def _metadata(dtype: torch.dtype, layout: torch.layout, ordered: bool) -> Metadata:
    size = torch.Size([2, 3])
    props = TensorProperties(dtype=dtype, layout=layout)
    tensors = [
        ("w", TensorStorageMetadata(props, size, [ChunkStorageMetadata(torch.Size([0, 0]), size)]))
    ]
    items = [*tensors, ("step", BytesStorageMetadata())]
    state = collections.OrderedDict(items) if ordered else dict(items)
    storage = {
        MetadataIndex("w", torch.Size([0, 0]), 0): _StorageInfo(
            PurePosixPath("__0_0.distcp"), 0, 24
        )
    }
    return Metadata(state, storage_data=storage, storage_meta=StorageMeta(checkpoint_id="c"))


DTYPES = [
    torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int8, torch.int64,
    torch.uint8, torch.bool, torch.complex64, torch.float8_e4m3fn, torch.float8_e5m2,
]  # fmt: skip


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("layout", [torch.strided, torch.sparse_coo], ids=str)
@pytest.mark.parametrize("ordered", [False, True], ids=["dict", "OrderedDict"])
def test_metadata_of_every_allowed_class_loads(
    tmp_path: Path, dtype: torch.dtype, layout: torch.layout, ordered: bool
) -> None:
    path = tmp_path / ".metadata"
    want = _metadata(dtype, layout, ordered)
    path.write_bytes(pickle.dumps(want))
    got = load_dcp_metadata(path)
    assert isinstance(got, Metadata)
    assert got.state_dict_metadata == want.state_dict_metadata
    assert type(got.state_dict_metadata) is type(want.state_dict_metadata)
    assert got.state_dict_metadata["w"].properties.dtype is dtype
    assert got.state_dict_metadata["w"].properties.layout is layout
    assert got.storage_data == want.storage_data
    assert isinstance(got.state_dict_metadata["step"], BytesStorageMetadata)
    assert got.storage_meta.checkpoint_id == "c"


def test_a_posix_path_in_metadata_loads(tmp_path: Path) -> None:
    want = _metadata(torch.float32, torch.strided, False)
    key = next(iter(want.storage_data))
    want.storage_data[key] = _StorageInfo(Path("__0_0.distcp"), 0, 24)
    path = tmp_path / ".metadata"
    path.write_bytes(pickle.dumps(want))
    got = load_dcp_metadata(path)
    assert got.storage_data[key].relative_path == Path("__0_0.distcp")


def test_a_pickled_item_is_refused_by_the_reader(tmp_path: Path) -> None:
    _save_dcp(tmp_path, {"w": torch.ones(2), "step": 7})
    state = {"w": torch.zeros(2)}
    _load_dcp(tmp_path, state)  # tensors only: fine
    assert torch.equal(state["w"], torch.ones(2))
    # DCP wraps the reader's error in a CheckpointException (a BaseException)
    with pytest.raises(BaseException, match=r"refused: item 'step' is a pickled object"):
        _load_dcp(tmp_path, {"w": torch.zeros(2), "step": 0})


@pytest.mark.parametrize(
    "where", ["../other/__0_0.distcp", "/abs/__0_0.distcp", "sub/__0_0.distcp", "..", ""]
)
def test_metadata_naming_a_data_file_outside_its_folder_is_refused(
    tmp_path: Path, where: str
) -> None:
    """Issue 27: DCP opens whatever path its metadata gives (another run's shards, say), which no
    manifest vouches for: only a plain name in the metadata's own folder is read."""
    want = _metadata(torch.float32, torch.strided, False)
    key = next(iter(want.storage_data))
    want.storage_data[key] = _StorageInfo(PurePosixPath(where) if where else "", 0, 24)
    path = tmp_path / ".metadata"
    path.write_bytes(pickle.dumps(want))
    with pytest.raises(UnsafeCheckpointError, match="refused: it names a data file outside its"):
        load_dcp_metadata(path)


def test_a_damaged_data_file_is_named_by_the_reader(tmp_path: Path) -> None:
    """Issue 27: a truncated ``.distcp`` (its manifest forged to match) is named in one short
    line, not torch's paragraph about zip archives naming the folder."""
    _save_dcp(tmp_path, {"w": torch.ones(1000)})
    shard = tmp_path / "__0_0.distcp"
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    with pytest.raises(BaseException) as err:  # noqa: PT011 - DCP wraps it (a BaseException)
        _load_dcp(tmp_path, {"w": torch.zeros(1000)})
    line = str(checkpoint_error(tmp_path, err.value))  # what resume and export print
    assert line.startswith(f"checkpoint {tmp_path}: __0_0.distcp could not be read: "), line
    assert "\n" not in line and len(line) <= 200 and "If you are seeing" not in line


def test_the_reader_reads_metadata_once_and_keeps_a_storage_meta(tmp_path: Path) -> None:
    _save_dcp(tmp_path, {"w": torch.ones(2)})
    reader = SafeFileSystemReader(tmp_path)
    first = reader.read_metadata()
    (tmp_path / ".metadata").write_bytes(dumps(Call("os", "system", ("true",))))
    assert reader.read_metadata() is first  # not read again
    assert first.storage_meta is not None and first.storage_meta.load_id == reader.load_id
    # a metadata record without storage_meta (older DCP) gets one
    meta = _metadata(torch.float32, torch.strided, False)
    meta.storage_meta = None
    other = tmp_path / "old"
    other.mkdir()
    (other / ".metadata").write_bytes(pickle.dumps(meta))
    got = SafeFileSystemReader(other).read_metadata()
    assert isinstance(got.storage_meta, StorageMeta)
    # one with a storage_meta keeps it (its checkpoint id), with this load's id set
    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / ".metadata").write_bytes(pickle.dumps(_metadata(torch.float32, torch.strided, False)))
    reader = SafeFileSystemReader(kept)
    got = reader.read_metadata()
    assert got.storage_meta.checkpoint_id == "c" and got.storage_meta.load_id == reader.load_id


def test_the_reader_refuses_a_planted_metadata(tmp_path: Path) -> None:
    marker = tmp_path / "PWNED"
    (tmp_path / ".metadata").write_bytes(dumps(Call("torch", "save", ("p", str(marker)))))
    with pytest.raises(UnsafeCheckpointError, match=r"it names torch\.save"):
        SafeFileSystemReader(tmp_path).read_metadata()
    assert not marker.exists()


# ----------------------------------------------------------------------------- load_torch_file


@dataclass
class Record:
    """A plain-data class a caller may allow (as DeepSpeed's loss-scaler records)."""

    scale: float


class _Payload:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):  # noqa: ANN204
        return (os.system, (f"touch {self.marker}",))


def _torch_save(obj: object, path: Path) -> Path:
    buf = io.BytesIO()
    torch.save(obj, buf)
    path.write_bytes(buf.getvalue())
    return path


@pytest.mark.parametrize("mmap", [True, False])
def test_a_tensor_file_loads(tmp_path: Path, mmap: bool) -> None:
    want = {"a": torch.arange(4.0), "b": [torch.ones(2, dtype=torch.bfloat16), 3, "x"]}
    path = _torch_save(want, tmp_path / "f.pt")
    got = load_torch_file(path, mmap=mmap)
    assert torch.equal(got["a"], want["a"]) and torch.equal(got["b"][0], want["b"][0])
    assert got["b"][1:] == [3, "x"]


@pytest.mark.parametrize(
    "obj",
    [
        "payload",
        {"state": "payload"},
        [torch.ones(1), "payload"],
    ],
)
def test_a_payload_in_a_torch_file_never_runs(tmp_path: Path, obj: object) -> None:
    marker = tmp_path / "PWNED"
    planted = _Payload(marker)
    if obj == "payload":
        obj = planted
    elif isinstance(obj, dict):
        obj = {"state": planted}
    else:
        obj = [torch.ones(1), planted]
    path = _torch_save(obj, tmp_path / "f.pt")
    for kw in ({}, {"mmap": False}, {"allowed": [Record]}):
        with pytest.raises(UnsafeCheckpointError, match=f"^{path} refused: "):
            load_torch_file(path, **kw)
        assert not marker.exists()


@pytest.mark.parametrize(
    "call",
    [
        Call("torch", "save", ("p", "MARKER")),
        Call("torch.serialization", "save", ("p", "MARKER")),
        Call("builtins", "eval", ("open('MARKER', 'w').close()",)),
        Call("pathlib", "Path.write_text", (Call("pathlib", "PosixPath", ("MARKER",)), "x")),
    ],
    ids=lambda c: f"{c.module}.{c.name}",
)
def test_a_torch_file_naming_a_callable_is_refused(tmp_path: Path, call: Call) -> None:
    marker = tmp_path / "PWNED"

    def subst(v: object) -> object:
        if isinstance(v, Call):
            return Call(v.module, v.name, tuple(subst(a) for a in v.args))
        return (
            str(marker)
            if v == "MARKER"
            else v.replace("MARKER", str(marker))
            if isinstance(v, str)
            else v
        )

    import zipfile

    path = tmp_path / "f.pt"
    _torch_save({"x": torch.ones(1)}, path)  # a real zip; its data.pkl replaced by the payload
    with zipfile.ZipFile(path) as z:
        members = {n: z.read(n) for n in z.namelist()}
    pkl = next(n for n in members if n.endswith("data.pkl"))
    members[pkl] = dumps(subst(call))
    with zipfile.ZipFile(path, "w") as z:
        for n, data in members.items():
            z.writestr(n, data)
    with pytest.raises(UnsafeCheckpointError, match=f"^{path} refused: "):
        load_torch_file(path)
    assert not marker.exists()


def test_an_allowed_class_loads_only_where_allowed(tmp_path: Path) -> None:
    path = _torch_save({"scaler": Record(2.0**16)}, tmp_path / "f.pt")
    assert load_torch_file(path, allowed=[Record]) == {"scaler": Record(2.0**16)}
    with pytest.raises(UnsafeCheckpointError, match=f"^{path} refused: "):
        load_torch_file(path)  # not allowed by default
    with pytest.raises(UnsafeCheckpointError):
        load_torch_file(path, allowed=[_Payload])  # another class allowed: still refused


def test_a_missing_torch_file_is_cannot_read(tmp_path: Path) -> None:
    with pytest.raises(UnsafeCheckpointError, match=r"f\.pt could not be read: No such file"):
        load_torch_file(tmp_path / "f.pt")


def test_a_damaged_torch_file_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "f.pt"
    path.write_bytes(b"PK\x03\x04 not really a zip")
    with pytest.raises(UnsafeCheckpointError, match=f"^{path} refused: ") as err:
        load_torch_file(path)
    assert "\n" not in str(err.value)


def test_a_refusal_names_the_first_sentence_of_the_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def fail(*a: object, **kw: object) -> None:
        raise RuntimeError("Weights only load failed.  It names\nposix.system. Re-run with ...")

    monkeypatch.setattr(torch, "load", fail)
    path = tmp_path / "f.pt"
    with pytest.raises(UnsafeCheckpointError) as err:
        load_torch_file(path)
    assert str(err.value) == f"{path} refused: Weights only load failed"  # one line, short


def test_torch_files_are_read_weights_only_and_memory_mapped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[dict] = []
    real = torch.load

    def spy(*a: object, **kw: object) -> object:
        calls.append(kw)
        return real(*a, **kw)

    monkeypatch.setattr(torch, "load", spy)
    path = _torch_save({"a": torch.ones(2)}, tmp_path / "f.pt")
    load_torch_file(path)
    load_torch_file(path, mmap=False, map_location="meta")
    assert [(c["weights_only"], c["mmap"], c["map_location"]) for c in calls] == [
        (True, True, "cpu"),
        (True, False, "meta"),
    ]


def test_a_damage_line_under_a_long_path_keeps_the_reason() -> None:
    """However long the checkpoint's path, the line keeps enough of the reason to say what is
    wrong (a run folder under a deep temporary directory cut torch's "failed reading zip archive"
    to "failed reading zip...")."""
    deep = Path("/tmp") / ("d" * 150) / "run" / "checkpoints" / "step_00000010"
    why = (
        "could not be read: PytorchStreamReader failed reading zip archive: failed finding central"
    )
    line = DamagedFile(deep / "model" / "__0_0.distcp", why).line(deep)
    assert (
        "model/__0_0.distcp could not be read: PytorchStreamReader failed reading zip archive"
        in line
    )
    assert "\n" not in line
