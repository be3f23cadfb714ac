"""torch's fake process group for the host probes (`host_probe`, `optimizer_probe`): a rank 0 of
`world` ranks whose collectives return at once, so that an engine's hooks and steps run their
host-side work alone."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch.distributed as dist


@contextlib.contextmanager
def fake_group(world: int) -> Iterator[None]:
    """The default process group, fake, of `world` ranks while inside; destroyed after."""
    # torch's fake backend registers itself as "fake" when its module is imported
    from torch.testing._internal.distributed import fake_pg  # noqa: F401  # why: test backend

    dist.init_process_group("fake", store=dist.HashStore(), rank=0, world_size=world)
    try:
        yield
    finally:
        dist.destroy_process_group()
