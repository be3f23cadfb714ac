"""DeepSpeed ZeRO checkpoints as an engine-neutral DCP ``StorageReader``.

DeepSpeed writes one optimizer file per rank holding that rank's flat fp32 partitions and AdamW
moments, plus the parameter shapes. This reader presents them under the neutral keys of
``zerofit.checkpoint.neutral`` with full shapes, so any engine at any world size (and
``zerofit export``) can read them. Files are opened weights-only and memory-mapped: building one
full tensor touches only the slices of it that each rank's file holds.

Layouts (the same arithmetic DeepSpeed's ``zero_to_fp32`` uses):
- ZeRO-3: each parameter is split on its own into ``ceil(numel / world)`` elements per rank; a
  rank's flat groups are its pieces of every parameter, in ``param_shapes`` order.
- ZeRO-1/2: each parameter group is flattened and cut into equal rank partitions; the file's
  ``param_slice_mappings`` give each parameter's fragment (start, numel) within the partition.
"""

from __future__ import annotations

import importlib
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint.metadata import (
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    TensorProperties,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.planner import LoadPlan, LoadPlanner
from torch.distributed.checkpoint.storage import StorageReader
from torch.futures import Future

from zerofit.checkpoint.neutral import MODEL, MOMENTS, OPTIM
from zerofit.checkpoint.safe_load import UnsafeCheckpointError, load_torch_file
from zerofit.errors import DamagedFile, UserError


def ds_safe_globals() -> list[Any]:
    """Plain-data classes DeepSpeed pickles into its checkpoint files (none of them runs code)."""
    found: list[Any] = []
    for module, names in (
        ("deepspeed.runtime.fp16.loss_scaler", ("LossScaler", "DynamicLossScaler")),
        ("deepspeed.runtime.zero.config", ("ZeroStageEnum",)),
        ("deepspeed.utils.tensor_fragment", ("fragment_address",)),
    ):
        try:  # DeepSpeed is optional: a ZeRO checkpoint is readable without it
            mod = importlib.import_module(module)
        except ImportError:
            continue
        found += [getattr(mod, n) for n in names if hasattr(mod, n)]
    return found


def load_ds_file(path: str | Path, map_location: Any = "cpu", mmap: bool = True) -> Any:
    """A DeepSpeed checkpoint file, read by `load_torch_file` with DeepSpeed's records allowed."""
    return load_torch_file(path, map_location, mmap, allowed=ds_safe_globals())


_OPTIM_FILE = re.compile(r"^(?:bf16_)?zero_pp_rank_(\d+)_mp_rank_00_optim_states\.pt$")


@dataclass
class _Rank:
    """One rank's file: flat fp32 partitions, moments and steps per group."""

    path: Path
    flats: list[torch.Tensor]
    moments: dict[str, list[torch.Tensor]]
    steps: list[float]
    slices: list[dict[str, Any]] | None  # ZeRO-1/2: name -> fragment_address per group


def _group_step(state: dict, groups: list[dict], g: int) -> float:
    step = state.get(g, {}).get("step")
    if step is None and g < len(groups):
        step = groups[g].get("step")
    return float(step) if step is not None else 0.0


def _read_rank(path: Path) -> tuple[_Rank, int]:
    sd = load_ds_file(path)
    try:
        osd = sd["optimizer_state_dict"]
        stage = int(osd["zero_stage"])
        if stage == 3:
            flats, base, slices = osd["fp32_flat_groups"], osd["optimizer_state_dict"], None
        else:
            flats = osd["single_partition_of_fp32_groups"]
            base, slices = osd["base_optimizer_state"], osd["param_slice_mappings"]
        state, groups = base["state"], base.get("param_groups", [])
        moments = {m: [state[g][m] for g in range(len(flats))] for m in MOMENTS}
        steps = [_group_step(state, groups, g) for g in range(len(flats))]
    except (KeyError, TypeError, IndexError, ValueError) as e:
        raise DamagedFile(path, f"is not a DeepSpeed ZeRO optimizer file ({e!r})") from None
    return _Rank(path, list(flats), moments, steps, slices), stage


def _virtual_slice(parts: list[torch.Tensor], start: int, length: int) -> torch.Tensor:
    """``torch.cat(parts)[start:start + length]`` without concatenating everything."""
    out, pos = [], 0
    for t in parts:
        n = t.numel()
        lo, hi = max(start, pos), min(start + length, pos + n)
        if lo < hi:
            out.append(t.reshape(-1)[lo - pos : hi - pos])
        pos += n
    if sum(o.numel() for o in out) != length:
        raise UnsafeCheckpointError("a partition is shorter than its parameter shapes say")
    return out[0] if len(out) == 1 else torch.cat(out)


@dataclass
class _Frozen:
    """A parameter outside the optimizer: its full shape and its flat pieces in rank order (or
    the one full tensor), memory-mapped; assembled only when read."""

    shape: tuple[int, ...]
    pieces: list[torch.Tensor]

    def full(self) -> torch.Tensor:
        flat = torch.cat([p.reshape(-1) for p in self.pieces])[: math.prod(self.shape)]
        if flat.numel() != math.prod(self.shape):
            raise UnsafeCheckpointError("the pieces of a frozen parameter do not add up")
        return flat.view(self.shape)


class ZeroCheckpointReader(StorageReader):
    """Read-only, offline view of a DeepSpeed ZeRO-1/2/3 checkpoint directory."""

    def __init__(self, model_dir: Path) -> None:
        super().__init__()
        self.dir = Path(model_dir)
        self.index_file: Path | None = None  # the model-states file, once read
        self._loaded = False

    # -- layout ------------------------------------------------------------------------------
    def _load(self) -> None:
        if self._loaded:
            return
        files = {int(m.group(1)): p for p in self.dir.iterdir() if (m := _OPTIM_FILE.match(p.name))}
        if not files or sorted(files) != list(range(len(files))):
            raise UnsafeCheckpointError(
                f"{self.dir} has no complete set of DeepSpeed optimizer files"
            )
        model_file = next(
            (self.dir / n for n in ("mp_rank_00_model_states.pt", "zero_pp_rank_0_mp_rank_00_model_states.pt")
             if (self.dir / n).is_file()),
            None,
        )  # fmt: skip
        if model_file is None:
            raise UnsafeCheckpointError(f"{self.dir} has no DeepSpeed model-states file")
        self.index_file = model_file  # the parameter shapes: what describes the tensors
        try:
            states = load_ds_file(model_file)
            groups = states["param_shapes"]
            self.shapes = [{n: tuple(s) for n, s in g.items()} for g in groups]
        except (KeyError, TypeError, AttributeError) as e:
            raise DamagedFile(model_file, f"has no parameter shapes ({e!r})") from None
        loaded = [_read_rank(files[r]) for r in range(len(files))]
        self.ranks = [r for r, _ in loaded]
        self.stage = loaded[0][1]
        self.world = len(self.ranks)
        self._check_not_swapped()
        self.group_of = {n: g for g, shapes in enumerate(self.shapes) for n in shapes}
        self.offsets: dict[str, int] = {}  # ZeRO-3: offset of each param's piece in a rank's flats
        pos = 0
        for shapes in self.shapes:
            for name, shape in shapes.items():
                self.offsets[name] = pos
                pos += math.ceil(math.prod(shape) / self.world)
        self.frozen = self._frozen(states)
        self._loaded = True

    def _check_not_swapped(self) -> None:
        """ZeRO-3 with the optimizer on NVMe saves each swapped sub-group's master and moments as
        DeepSpeed's swap files (``offloaded_tensors/``, named by DeepSpeed's internal parameter
        ids), and empty tensors in the optimizer files: only DeepSpeed's own loader, into the
        same layout, reads them back."""
        swapped = (self.dir / "offloaded_tensors").is_dir() and any(
            f.numel() == 0 and sum(math.prod(s) for s in self.shapes[g].values())
            for r in self.ranks
            for g, f in enumerate(r.flats[: len(self.shapes)])
        )
        if swapped:
            raise UserError(
                f"checkpoint {self.dir.parent}: its optimizer states are in DeepSpeed's NVMe "
                "swap files (model/offloaded_tensors), which only DeepSpeed reads back: resume "
                f"it with ZeRO-3, offload_optimizer: nvme, on {self.world} rank(s)"
            )

    def _frozen(self, states: dict) -> dict[str, _Frozen]:
        """The parameters outside the optimizer (a LoRA base), by name, read lazily. ZeRO-3:
        each rank's model-states file holds its flat piece of each; ZeRO-2: the file holds them
        whole; ZeRO-1: they are the module state's entries that are neither optimized nor buffers."""
        try:
            if self.stage == 3:
                shapes = states.get("frozen_param_shapes") or {}
                if not shapes:
                    return {}
                files = [f"zero_pp_rank_{r}_mp_rank_00_model_states.pt" for r in range(self.world)]
                parts = [load_ds_file(self.dir / f)["frozen_param_fragments"] for f in files]
                return {n: _Frozen(tuple(s), [p[n] for p in parts]) for n, s in shapes.items()}
            found = states.get("frozen_param_fragments")
            if not found:
                skip = set(self.group_of) | set(states.get("buffer_names") or ())
                found = {n: t for n, t in _unique(states["module"]).items() if n not in skip}
            return {n: _Frozen(tuple(t.shape), [t]) for n, t in found.items()}
        except (KeyError, TypeError, AttributeError, RuntimeError) as e:
            raise DamagedFile(
                self.index_file or self.dir, f"has unreadable frozen parameters ({e!r})"
            ) from None

    def full(self, key: str) -> torch.Tensor:
        """The full tensor under a neutral key, assembled from every rank's file."""
        self._load()
        if key.startswith(MODEL):
            name, kind = key[len(MODEL) :], "param"
        else:
            name, _, kind = key[len(OPTIM) :].rpartition(".")
        if kind == "param" and name in self.frozen:
            return self.frozen[name].full()
        if name not in self.group_of:
            raise UnsafeCheckpointError(f"{self.dir} has no parameter {name!r}")
        g = self.group_of[name]
        if kind == "step":
            return torch.tensor(self.ranks[0].steps[g], dtype=torch.float32)
        shape = self.shapes[g][name]
        numel = math.prod(shape)
        pieces = [self._piece(rank, kind, g, name, numel) for rank in self.ranks]
        flat = torch.cat([p for p in pieces if p is not None])[:numel]
        if flat.numel() != numel:
            where = self.index_file or self.dir
            raise DamagedFile(where, f"gives {name!r} a shape its partitions do not fill")
        return flat.view(shape)

    def _piece(self, rank: _Rank, kind: str, g: int, name: str, numel: int) -> torch.Tensor | None:
        """One rank's piece of a parameter (or moment); None when the rank holds none of it."""
        try:
            source = rank.flats if kind == "param" else rank.moments[kind]
            if self.stage == 3:
                part = math.ceil(numel / self.world)
                return _virtual_slice(source, self.offsets[name], part)
            if rank.slices is not None and name in rank.slices[g]:
                frag = rank.slices[g][name]
                return source[g].reshape(-1)[frag.start : frag.start + frag.numel]
        except (UnsafeCheckpointError, IndexError, KeyError, TypeError, AttributeError) as e:
            raise DamagedFile(rank.path, f"does not fit the parameter shapes ({e})") from None
        return None

    # -- StorageReader -----------------------------------------------------------------------
    def reset(self, checkpoint_id: Any = None) -> None:
        pass

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        self._load()
        md: dict[str, Any] = {}
        for g, shapes in enumerate(self.shapes):
            dtype = self.ranks[0].flats[g].dtype
            for name, shape in shapes.items():
                md[MODEL + name] = _tensor_md(shape, dtype)
                for m in MOMENTS:
                    md[f"{OPTIM}{name}.{m}"] = _tensor_md(shape, self.ranks[0].moments[m][g].dtype)
                md[f"{OPTIM}{name}.step"] = _tensor_md((), torch.float32)
        for name, frozen in self.frozen.items():  # no optimizer state: nothing trains them
            md[MODEL + name] = _tensor_md(frozen.shape, frozen.pieces[0].dtype)
        return Metadata(state_dict_metadata=md, storage_data={})

    def set_up_storage_reader(
        self, metadata: Metadata, is_coordinator: bool, *a: Any, **k: Any
    ) -> None:
        pass

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        return plan

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        return plans

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        for req in plan.items:
            src = self.full(req.storage_index.fqn)
            for dim, (off, length) in enumerate(zip(req.storage_offsets, req.lengths, strict=True)):
                src = src.narrow(dim, off, length)
            target = planner.resolve_tensor(req).detach()
            target.copy_(src)
            planner.commit_tensor(req, target)
        fut: Future[None] = Future()
        fut.set_result(None)
        return fut

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: Any) -> bool:
        return Path(checkpoint_id).is_dir()


def _unique(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The first name of each tensor (tied parameters share one storage)."""
    seen: set[tuple[int, int]] = set()
    out = {}
    for name, t in tensors.items():
        key = (t.untyped_storage().data_ptr(), t.storage_offset())
        if key not in seen:
            seen.add(key)
            out[name] = t
    return out


def _tensor_md(shape: tuple[int, ...], dtype: torch.dtype) -> TensorStorageMetadata:
    size = torch.Size(shape)
    chunk = ChunkStorageMetadata(offsets=torch.Size([0] * len(shape)), sizes=size)
    return TensorStorageMetadata(TensorProperties(dtype=dtype), size, [chunk])


_ = MetadataIndex  # storage indices are built by DCP's planner from the metadata above
