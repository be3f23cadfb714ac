"""Reading checkpoint files without running code from them.

Pickle runs whatever a file tells it to; a checkpoint from a colleague, a shared drive or the web
must not. Everything zerofit reads back goes through one of these:

- ``load_torch_file``: ``torch.load(weights_only=True)``: tensors, containers and primitives only,
  plus the few plain-data classes DeepSpeed pickles into its own ``.pt`` files (its loss-scaler
  records, the ZeRO stage enum, fragment addresses), memory-mapped so a shard is not copied.
- ``load_dcp_metadata``: torch.distributed.checkpoint's ``.metadata`` is a raw pickle that PyTorch
  itself unpickles without restriction. Here an allowlist of DCP's own dataclasses is all a
  metadata file may name.
- ``SafeFileSystemReader``: PyTorch's DCP reader with the metadata read as above and no pickled
  (non-tensor) items: zerofit saves tensors only, so a checkpoint that asks for one is refused.

A refused or unreadable file raises ``DamagedFile`` naming it; nothing in it has run.
"""

from __future__ import annotations

import dataclasses
import pickle
from collections.abc import Sequence
from pathlib import Path, PurePath
from typing import Any

import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, LoadPlanner, ReadItem
from torch.futures import Future

from zerofit.errors import DamagedFile, UnsafeCheckpointError, UserError
from zerofit.report import quiet

__all__ = [  # UnsafeCheckpointError: what every refusal here is, for the modules reading files
    "DamagedFile",
    "SafeFileSystemReader",
    "UnsafeCheckpointError",
    "load_dcp_metadata",
    "load_torch_file",
    "reason",
]

_DCP_CLASSES = {
    ("torch.distributed.checkpoint.metadata", n)
    for n in (
        "Metadata",
        "MetadataIndex",
        "StorageMeta",
        "TensorProperties",
        "TensorStorageMetadata",
        "BytesStorageMetadata",
        "ChunkStorageMetadata",
        "_MEM_FORMAT_ENCODING",
    )
} | {
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch", "Size"),
    ("collections", "OrderedDict"),
    ("pathlib", "PosixPath"),
    ("pathlib", "WindowsPath"),
    ("pathlib", "PurePosixPath"),
}


class _MetadataUnpickler(pickle.Unpickler):
    """Resolves only DCP's plain-data classes, torch dtypes and layouts; anything else is refused."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _DCP_CLASSES:
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        if (module, name) == ("torch.serialization", "_get_layout"):
            return _layout
        raise pickle.UnpicklingError(f"it names {module}.{name}, which a checkpoint never needs")


def _layout(name: str) -> torch.layout:
    layouts = {str(v): v for v in vars(torch).values() if isinstance(v, torch.layout)}
    if name not in layouts:
        raise pickle.UnpicklingError(f"unknown tensor layout {name!r}")
    return layouts[name]


def load_dcp_metadata(path: Path) -> Metadata:
    """Unpickle a DCP ``.metadata`` file through the allowlist. Every data file it names must be a
    plain name in its own folder (DCP would open any path it gave: another run's files)."""
    try:
        with open(path, "rb") as f:
            meta = _MetadataUnpickler(f).load()
    except OSError as e:
        raise DamagedFile(path, f"could not be read: {e.strerror or e}") from None
    except Exception as e:  # noqa: BLE001 - any failure of a hostile/damaged pickle is one line
        raise DamagedFile(path, f"refused: {reason(e)}") from None
    if not isinstance(meta, Metadata) or not isinstance(meta.storage_data, dict | None):
        raise DamagedFile(path, "refused: not a checkpoint metadata record")
    for info in (meta.storage_data or {}).values():
        raw = getattr(info, "relative_path", None)
        name = str(raw) if isinstance(raw, str | PurePath) else ""
        if name in ("", ".", "..") or "/" in name or "\\" in name:
            raise DamagedFile(
                path, f"refused: it names a data file outside its folder: {name or raw!r:.80}"
            )
    return meta


def reason(e: BaseException) -> str:
    """A loader's error as a short reason: its first sentence on one line (see `DamagedFile`)."""
    text = " ".join(str(e).split()) or type(e).__name__
    return text.split(". ")[0][:300]


def load_torch_file(
    path: str | Path, map_location: Any = "cpu", mmap: bool = True, allowed: Sequence[Any] = ()
) -> Any:
    """``torch.load`` that cannot run code: weights only, plus the plain-data classes `allowed`
    (an engine's records, e.g. DeepSpeed's loss scaler)."""
    try:
        with torch.serialization.safe_globals(list(allowed)), quiet.weights_only_load():
            return torch.load(path, map_location=map_location, weights_only=True, mmap=mmap)
    except OSError as e:
        raise DamagedFile(path, f"could not be read: {e.strerror or e}") from None
    except Exception as e:  # noqa: BLE001
        raise DamagedFile(path, f"refused: {reason(e)}") from None


class SafeFileSystemReader(FileSystemReader):
    """DCP's file reader, minus its two unrestricted unpickles (metadata and byte items)."""

    def __init__(self, path: str | Path) -> None:
        super().__init__(str(path))
        self._root = Path(path)
        self.index_file = self._root / ".metadata"  # what describes the tensors
        self._metadata: Metadata | None = None

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        if self._metadata is None:
            self._metadata = load_dcp_metadata(self._root / ".metadata")
        meta = self._metadata
        if getattr(meta, "storage_meta", None) is None:
            meta.storage_meta = StorageMeta()
        meta.storage_meta.load_id = self.load_id
        return meta

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Any:
        """DCP's reads, one data file at a time: a file that fails is named (DamagedFile)."""
        by_file: dict[str, list[ReadItem]] = {}
        for item in plan.items:
            name = str(self.storage_data[item.storage_index].relative_path)
            if item.type == LoadItemType.BYTE_IO:
                raise DamagedFile(
                    self._root / name,
                    f"refused: item {item.storage_index.fqn!r} is a pickled object (zerofit "
                    "checkpoints hold tensors only)",
                )
            by_file.setdefault(name, []).append(item)
        for name, items in by_file.items():
            try:
                super().read_data(dataclasses.replace(plan, items=items), planner).wait()
            except UserError:
                raise
            except Exception as e:  # noqa: BLE001 - a damaged file: one line naming it
                raise DamagedFile(self._root / name, f"could not be read: {reason(e)}") from None
        done: Future[None] = Future()
        done.set_result(None)
        return done
