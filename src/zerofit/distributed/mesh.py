"""Process-group set-up and the data-parallel device mesh (a small `ParallelDims`)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from zerofit.config.sizes import gib, memory_fraction


@dataclass
class DistContext:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    replicate: int  # outer mesh dim (hybrid sharding replicas)
    shard: int  # inner mesh dim (ranks one model is sharded over)
    _mesh: DeviceMesh | None = None

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def dp_rank(self) -> int:
        return self.rank

    @property
    def dp_size(self) -> int:
        return self.world_size

    @property
    def mesh(self) -> DeviceMesh:
        """1-D ("dp_shard",) mesh, or 2-D ("dp_replicate", "dp_shard") for hybrid sharding."""
        if self._mesh is None:
            if self.replicate > 1:
                self._mesh = init_device_mesh(
                    self.device.type,
                    (self.replicate, self.shard),
                    mesh_dim_names=("dp_replicate", "dp_shard"),
                )
            else:
                self._mesh = init_device_mesh(
                    self.device.type, (self.shard,), mesh_dim_names=("dp_shard",)
                )
        return self._mesh

    def barrier(self) -> None:
        if dist.is_initialized():
            dist.barrier()

    def all_reduce_mean(self, t: torch.Tensor) -> torch.Tensor:
        if dist.is_initialized() and self.world_size > 1:
            dist.all_reduce(t, op=dist.ReduceOp.SUM)
            t /= self.world_size
        return t

    def all_reduce_sum(self, t: torch.Tensor) -> torch.Tensor:
        if dist.is_initialized() and self.world_size > 1:
            dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return t

    def broadcast_object(self, obj: object) -> object:
        if not dist.is_initialized() or self.world_size == 1:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def gather_object(self, obj: object) -> list[object]:
        """Every rank's ``obj``, in rank order, on every rank."""
        if not dist.is_initialized() or self.world_size == 1:
            return [obj]
        out: list[object] = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out


def init_distributed(replicate_degree: int = 1) -> DistContext:
    """Join the process group (NCCL on GPUs, gloo on CPU), or run as a single process."""
    rank = int(os.environ.get("RANK", 0))
    world = int(os.environ.get("WORLD_SIZE", 1))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
        backend = "cpu:gloo,cuda:nccl"
    else:
        device = torch.device("cpu")
        backend = "gloo"
    if not dist.is_initialized():
        kwargs: dict = {"device_id": device} if device.type == "cuda" else {}
        if "MASTER_ADDR" not in os.environ:  # a plain single process: an in-memory store, no ports
            kwargs.update(store=dist.HashStore(), rank=0, world_size=1)
        elif os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
            kwargs.update(store=_attempt_store(world), rank=rank, world_size=world)
        dist.init_process_group(backend=backend, timeout=timedelta(minutes=30), **kwargs)
    return DistContext(rank, world, local_rank, device, replicate_degree, world // replicate_degree)


def cap_gpu_memory(limit: int | None, ctx: DistContext) -> float | None:
    """`train.gpu_memory_limit`: cap this rank's caching allocator at `limit` bytes of its GPU
    (before the model is built), so that a run on a big card rehearses a smaller one. Rank 0 says
    what it applied; on CPU there is nothing to cap (a note). Returns the fraction applied."""
    if limit is None:
        return None
    if ctx.device.type != "cuda":
        if ctx.is_main:
            print(
                f"note: train.gpu_memory_limit ({gib(limit)}) is ignored on "
                f"{ctx.device.type.upper()}: there is no GPU memory to cap",
                flush=True,
            )
        return None
    total = torch.cuda.get_device_properties(ctx.device).total_memory
    fraction = memory_fraction(limit, total, torch.cuda.get_device_name(ctx.device))
    torch.cuda.set_per_process_memory_fraction(fraction, ctx.device)
    if ctx.is_main:
        print(
            f"train.gpu_memory_limit: each rank's allocator capped at {gib(limit)} of "
            f"{gib(total)} (fraction {fraction:.4f})",
            flush=True,
        )
    return fraction


def _attempt_store(world: int) -> dist.Store:
    """The elastic agent's store, under a prefix of this restart attempt: after a restart the
    agent's store still holds the previous attempt's keys (gloo's peer addresses among them),
    and a rank that read a dead peer's address would fail to connect."""
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    store = dist.TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        world,
        is_master=False,
        timeout=timedelta(minutes=30),
    )
    return dist.PrefixStore(f"zerofit/attempt_{attempt}", store)


def shutdown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
