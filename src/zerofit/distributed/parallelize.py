"""Model transforms, applied in torchtitan's order: AC -> compile -> per-block shard -> root.

Each `apply_*` takes explicit arguments (no config object), so it can be used on its own.
`materialize_` then allocates the (possibly sharded) parameters on the real device and fills them
with a deterministic, sharding-independent init: every parameter is generated in full from its own
seed (derived from the init seed and its name) and each rank keeps only its shard. No rank ever
holds more than one full parameter at a time.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from functools import partial

import torch
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.distributed.tensor import DTensor, distribute_tensor
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

from zerofit.distributed.ac_blocks import checkpointed_blocks
from zerofit.models import loss
from zerofit.models.init import param_seed
from zerofit.models.llama import strip_wrapper_names
from zerofit.models.meta import allocate_


def get_blocks(model: nn.Module, blocks_path: str) -> nn.ModuleList:
    blocks = model.get_submodule(blocks_path)
    assert isinstance(blocks, nn.ModuleList), f"{blocks_path} is not a ModuleList"
    return blocks


def _save_matmuls_policy(ctx: object, op: object, *args: object, **kwargs: object) -> object:
    return CheckpointPolicy.MUST_SAVE if op in _SAVED_OPS else CheckpointPolicy.PREFER_RECOMPUTE


def _saved_ops() -> set[object]:
    aten = torch.ops.aten
    names = [
        "mm",
        "addmm",
        "bmm",
        "_scaled_mm",  # precision.fp8's float8 matmuls
        "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_cudnn_attention",
        "_scaled_dot_product_flash_attention_for_cpu",
    ]
    return {getattr(aten, n).default for n in names if hasattr(aten, n)}


_SAVED_OPS = _saved_ops()


def apply_ac(blocks: nn.ModuleList, mode: str, every: int = 2, first: int | None = None) -> int:
    """Activation checkpointing. 'full' recomputes every block, 'every_k' every `every`-th block,
    'first_k' the first `first` blocks (Megatron's "block" method: backward reaches the later
    blocks first, so their saved activations are freed while few gradients exist yet);
    'selective' (op-level, as torchtitan's) keeps the outputs of matmuls and attention and recomputes
    only the cheap ops between them (norms, RoPE, SiLU, products). Returns the blocks wrapped."""
    chosen = checkpointed_blocks(mode, len(blocks), every, first)
    kwargs: dict = {}
    if mode == "selective":
        kwargs["context_fn"] = partial(create_selective_checkpoint_contexts, _save_matmuls_policy)
    for i in chosen:
        blocks[i] = checkpoint_wrapper(blocks[i], preserve_rng_state=False, **kwargs)
    return len(chosen)


def apply_compile(blocks: nn.ModuleList) -> None:
    """torch.compile each block separately: one graph per block, reused across identical blocks.
    The fused output layer's per-chunk softmax and gradient are compiled too (`models.loss`).

    A block recomputed in full that holds frozen parameters (a LoRA or QLoRA base) has its own
    forward compiled inside the checkpoint, the recomputation running eagerly around it, as a
    ZeRO-3 block's (`apply_compile_forward`). Compiling the checkpointed block as a whole (the
    region's recomputation planned by the compiler, as for every other block) kept nearly all of
    such a block's activations on torch 2.11: 53 MiB saved by a 4-layer QLoRA toy's forward
    against 2.5 MiB recomputed eagerly and 42 MiB with no checkpointing (2026-12-05, CPU,
    `benchmarks/ac_saved_bytes.py`), and an 8B QLoRA ran out of memory on the GPU (it trains at
    16.6 GiB this way). torch 2.13 frees nearly all of them either way (2.7 MiB)."""
    loss.COMPILE_CHUNKS = True
    inside = [_recompute_around(block) for block in blocks]
    _replay_free_side_effects(b for b, i in zip(blocks, inside, strict=True) if not i)
    _compile_inside_checkpoints([b for b, i in zip(blocks, inside, strict=True) if i])
    for i, block in enumerate(list(blocks)):
        if not inside[i]:
            blocks[i] = torch.compile(block, fullgraph=True)


def _recompute_around(block: nn.Module) -> bool:
    """Whether `block` is checkpointed in full (not op-selective) and holds frozen parameters.
    Op-selective checkpointing is `apply_ac`'s ``context_fn``, which the wrapper keeps in its
    ``checkpoint_fn`` partial."""
    checkpoint_fn = getattr(block, "checkpoint_fn", None)
    selective = "context_fn" in getattr(checkpoint_fn, "keywords", {})
    frozen = any(not p.requires_grad for p in block.parameters())
    return _checkpointed([block]) and not selective and frozen


def _checkpointed(blocks: Iterable[nn.Module]) -> bool:
    """Whether `apply_ac` wrapped any of `blocks`."""
    return any(hasattr(block, "_checkpoint_wrapped_module") for block in blocks)


def _replay_free_side_effects(blocks: Iterable[nn.Module]) -> None:
    """Checkpointed blocks compiled: Dynamo refuses a forward that writes state outside the block
    ("HOP: Unsafe side effect"), because recomputation would write it again. The writes a
    Hugging Face block makes are set-and-restore bookkeeping (the `kernels` package's context
    variable around a hub-kernel layer's forward, transformers 5.25 with kernels 0.19): replaying
    them or not leaves the same state, so Dynamo is told not to replay them."""
    if not _checkpointed(blocks):
        return
    # deferred: torch._dynamo takes ~1 s to import; only a compiled run gets here
    import torch._dynamo.config as dynamo_config

    if hasattr(dynamo_config, "skip_fwd_side_effects_in_bwd_under_checkpoint"):
        dynamo_config.skip_fwd_side_effects_in_bwd_under_checkpoint = True


def apply_compile_forward(blocks: nn.ModuleList) -> None:
    """torch.compile each block's own forward only, leaving `block(...)` (and so every forward
    hook) eager: for engines whose hooks gather parameters and must not be traced (ZeRO-3)."""
    loss.COMPILE_CHUNKS = True
    _compile_inside_checkpoints(list(blocks))


def _compile_inside_checkpoints(blocks: list[nn.Module]) -> None:
    """Compile each block's own forward (inside its checkpoint wrapper, if any).

    Blocks may differ in what Dynamo guards on (ZeRO-3 parameter state), so the recompile limit
    is raised to one graph per block rather than failing at PyTorch's default of 8."""
    # deferred: torch._dynamo takes ~1 s to import, and only a compiled run (torch.compile, just
    # below, imports it too) reaches here; CPU runs never compile
    import torch._dynamo.config as dynamo_config

    limit = len(blocks) + 8
    for name in ("recompile_limit", "cache_size_limit"):  # renamed in recent PyTorch
        if hasattr(dynamo_config, name):
            setattr(dynamo_config, name, max(getattr(dynamo_config, name), limit))
    if _checkpointed(blocks) and torch.cuda.is_available():
        # A compiled region inside activation checkpointing fails on torch 2.11 while CUDA
        # allocations are recorded (pytorch/pytorch#179536, whose repro records them; ZeRO-3 + AC
        # + compile on the H200, 2026-12-03): such a run records none (an OOM report then has
        # no snapshot).
        torch.cuda.memory._record_memory_history(enabled=None)
    for block in blocks:
        inner = getattr(block, "_checkpoint_wrapped_module", block)
        inner.forward = torch.compile(inner.forward, fullgraph=True)  # type: ignore[method-assign]


def full_param(
    name: str,
    shape: tuple[int, ...] | torch.Size,
    device: torch.device,
    *,
    init_seed: int,
    init_param_: Callable[[str, torch.Tensor, torch.Generator], None],
    weights: Callable[[str], torch.Tensor] | None = None,
) -> torch.Tensor:
    """One parameter's full value: from disk in the dtype it was read in (so a copy into a
    parameter of that dtype keeps its bits: a QLoRA base's NF4 words), or generated in fp32 from
    its own name-derived seed (also when ``weights`` answers None: not on disk, e.g. a LoRA
    adapter)."""
    bare = strip_wrapper_names(name)
    loaded = weights(bare) if weights is not None else None
    dtype = loaded.dtype if loaded is not None else torch.float32
    full = torch.empty(tuple(shape), dtype=dtype, device=device)
    if loaded is not None:
        full.copy_(loaded)
    else:
        gen = torch.Generator(device=device).manual_seed(param_seed(init_seed, bare))
        init_param_(bare, full, gen)
    return full


def materialize_(
    model: nn.Module,
    device: torch.device,
    *,
    init_seed: int,
    init_param_: Callable[[str, torch.Tensor, torch.Generator], None],
    weights: Callable[[str], torch.Tensor] | None = None,
) -> None:
    """Allocate meta parameters on `device` and fill them (weights from disk, else seeded init)."""
    allocate_(model, device)
    gen_device = device if device.type == "cuda" else torch.device("cpu")
    with torch.no_grad():
        for name, param in model.named_parameters():
            full = full_param(
                name,
                param.shape,
                gen_device,
                init_seed=init_seed,
                init_param_=init_param_,
                weights=weights,
            )
            if isinstance(param, DTensor):
                local = distribute_tensor(
                    full, param.device_mesh, param.placements, src_data_rank=None
                )
                param.to_local().copy_(local.to_local())
            else:
                param.copy_(full)
            del full
