"""The engine-neutral view of a checkpoint: full-shape tensors by name, read one at a time.

Every engine's checkpoint is read through a DCP ``StorageReader``: DCP's own files through
``SafeFileSystemReader``, DeepSpeed's through the reader its backend registers. The keys are the
same whoever wrote them:

    model.<param>                    master weights (clean names: no wrapper segments)
    optim.state.<param>.exp_avg      AdamW first moment
    optim.state.<param>.exp_avg_sq   AdamW second moment
    optim.state.<param>.step         AdamW step count (a scalar)

A DCP-native engine (DDP, FSDP2) loads its sharded state straight from any such reader, DCP
resharding it; other engines and ``zerofit export`` read one full tensor at a time.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.metadata import TensorStorageMetadata
from torch.distributed.checkpoint.storage import StorageReader

from zerofit.checkpoint.safe_load import SafeFileSystemReader, reason
from zerofit.errors import DamagedFile, UnsafeCheckpointError, UserError, one_line
from zerofit.report import quiet

MODEL = "model."
OPTIM = "optim.state."
MOMENTS = ("exp_avg", "exp_avg_sq")
# What reading a damaged or hostile checkpoint can raise (DCP's exception is a BaseException).
READ_ERRORS = (Exception, CheckpointException)

ReaderFactory = Callable[[Path], StorageReader]


def open_reader(
    model_dir: Path, fmt: str, readers: Mapping[str, ReaderFactory] | None = None
) -> StorageReader:
    """A reader for a checkpoint's model files: DCP's, or one of `readers` (by format), which an
    engine whose files are not DCP provides (`zerofit.backends.checkpoint_readers`)."""
    factory = {"dcp": SafeFileSystemReader, **(readers or {})}.get(fmt)
    if factory is None:
        raise UserError(f"checkpoint {model_dir.parent} has an unknown format {fmt!r}")
    return factory(model_dir)


def checkpoint_error(ckpt: Path, e: BaseException, index: Path | None = None) -> UserError:
    """One line for any failure while reading a checkpoint's tensors: a file that failed named
    relative to ``ckpt`` (`DamagedFile.line`); a failure no file owns (DCP's planning against the
    metadata) names ``index``, the file that describes the tensors, when given."""
    cause: BaseException = e
    failures = getattr(e, "failures", None)  # DCP's CheckpointException: {rank: (exc, tb)}
    if failures:
        first = next(iter(failures.values()))
        cause = first[0] if isinstance(first, tuple) else first
    if isinstance(cause, DamagedFile):
        return UnsafeCheckpointError(cause.line(ckpt))
    if isinstance(cause, UserError):
        return cause
    while cause.__cause__ is not None and not str(cause):
        cause = cause.__cause__
    if index is not None:
        return UnsafeCheckpointError(
            DamagedFile(index, f"does not fit what is loaded: {reason(cause)}").line(ckpt)
        )
    return UnsafeCheckpointError(one_line(f"checkpoint {ckpt} could not be read: ", reason(cause)))


def index_file(reader: StorageReader) -> Path | None:
    """The file that describes a reader's tensors (DCP's ``.metadata``), where it has one."""
    return getattr(reader, "index_file", None)


class NeutralView:
    """Offline access to a checkpoint's tensors by neutral key (no process group needed)."""

    def __init__(self, reader: StorageReader, where: Path) -> None:
        self.reader, self.where = reader, where
        try:
            self.metadata = reader.read_metadata()
        except READ_ERRORS as e:
            raise checkpoint_error(where, e) from None
        self.entries: dict[str, tuple[tuple[int, ...], torch.dtype]] = {
            key: (tuple(md.size), md.properties.dtype)
            for key, md in self.metadata.state_dict_metadata.items()
            if isinstance(md, TensorStorageMetadata)
        }

    def names(self) -> list[str]:
        """Parameter names (without the ``model.`` prefix), in the order they were saved."""
        return [k[len(MODEL) :] for k in self.entries if k.startswith(MODEL)]

    def read(self, key: str, dtype: torch.dtype | None = None) -> torch.Tensor:
        if key not in self.entries:
            raise UserError(f"checkpoint {self.where} has no tensor {key!r}")
        shape, saved = self.entries[key]
        out = {key: torch.empty(shape, dtype=dtype or saved)}
        try:
            with quiet.single_process_dcp():
                dcp.load(out, storage_reader=self.reader, no_dist=True)
        except READ_ERRORS as e:
            raise checkpoint_error(self.where, e, index_file(self.reader)) from None
        return out[key]
