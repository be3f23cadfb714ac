"""The run as configured, beside the plan: its forecast, and when it does not fit, what would.

`zerofit plan -c CFG` ranks every strategy, but the config names one: its engine and options,
its activation checkpointing (none, selective, full, first_k with its k, every_k with its k) and
its micro-batch x accumulation. `as_configured` forecasts exactly that, whether or not the plan
lists it (the plan's first_k is the fewest blocks that fit, and it has no every_k), and says
where it ranks. With `parallel.backend: auto` the run takes the planner's pick (`resolve_auto`):
that is the row as configured.

When it does not fit, `suggestions` forecasts the same run with one change each: a micro-batch
of 1 (only when it is larger), full activation checkpointing, LoRA, QLoRA (each when not already
on), CPU offload and NVMe offload (the option sets of the configured engine that offload, as the
engine registry lists them; every engine's under `auto`) and the longest shorter sequence that
fits.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from zerofit.backends import engines
from zerofit.backends.terms import Workload
from zerofit.config import Config, compiles, get_field, with_fields
from zerofit.errors import UserError
from zerofit.models.shape import ModelShape
from zerofit.planner.adapters import RANK, estimated_adapters
from zerofit.planner.auto import keeps_ac
from zerofit.planner.memory import Strategy, adapters_for, strategy_for
from zerofit.planner.plan import (
    Option,
    candidates,
    closest,
    evaluate,
    fastest_split,
    left_out,
    near_limit,
    plan,
    recommend,
)
from zerofit.planner.shape import Hardware

SHORTEST = 128  # the shortest sequence `suggestions` tries (halving from the configured one)


@dataclass(frozen=True)
class Configured:
    """The run as configured: its option, its 1-based rank among the plan's options (ties after
    them), its index in them when the plan lists it, and whether the planner picks it (`auto`)."""

    option: Option
    rank: int
    listed: int | None
    auto: bool


@dataclass(frozen=True)
class Suggestion:
    """The configured run with one change: what it is, the fields that make it, its forecast."""

    change: str
    overrides: dict[str, object]
    option: Option


def rank_key(o: Option) -> tuple[bool, float, float]:
    """The plan's order: fitting first, then the fastest, then the least memory."""
    return (not o.fits, o.speed.step_time, o.memory.peak_reserved)


def configured_strategy(cfg: Config) -> Strategy | None:
    """The strategy a config names (None for `auto`); `ac_every` only counts under every_k."""
    if cfg.parallel.backend not in engines():
        return None
    s = strategy_for(cfg)
    return s if s.activation_checkpointing == "every_k" else replace(s, ac_every=2)


def as_configured(
    m: ModelShape,
    w: Workload,
    hw: Hardware,
    cfg: Config,
    options: list[Option],
    splits: list[tuple[int, int]] | None = None,
) -> Configured:
    """The config's own strategy at its micro-batch x accumulation (`w`; with a fixed global
    batch that `w` does not make, at the split of `splits` the plan picks for that strategy), or
    the planner's pick under `auto` (as `resolve_auto` takes it: the recommendation, else one
    near the limit, else the closest)."""
    s = configured_strategy(cfg)
    if s is None:  # the activation checkpointing the user wrote is kept (`resolve_auto`)
        picked = plan(m, w, hw, cfg, splits, keep_ac=True) if keeps_ac(cfg) else options
        o = recommend(picked) or near_limit(picked, hw) or closest(picked)
    elif splits is None or (w.micro_batch_size, w.grad_accum_steps) in splits:
        o = evaluate(m, w, hw, s)
    else:
        o = fastest_split(m, w, hw, s, splits)
    for i, x in enumerate(options):
        if x.strategy == o.strategy and (x.workload or w) == (o.workload or w):
            return Configured(x, i + 1, i, s is None)
    rank = 1 + sum(1 for x in options if rank_key(x) <= rank_key(o))
    return Configured(o, rank, None, s is None)


def _best(options: list[Option]) -> Option:
    return recommend(options) or min(options, key=lambda o: o.memory.peak_reserved)


def _forecast(m: ModelShape, w: Workload, hw: Hardware, cfg: Config, s: Strategy | None) -> Option:
    """The run of `cfg` at `w`: strategy `s`, or where `s` is None (`auto`) or its engine refuses
    `cfg`, the planner's best of the engines that take it."""
    if s is None or s.backend in left_out(cfg):
        return _best(plan(m, w, hw, cfg))
    return evaluate(m, w, hw, replace(s, options=s.engine.opts(cfg)))


def _smaller_batch(
    m: ModelShape, w: Workload, hw: Hardware, cfg: Config, s: Strategy | None
) -> list[Suggestion]:
    if w.micro_batch_size <= 1:
        return []  # never advise lowering a micro-batch that is already 1
    accum = w.micro_batch_size * w.grad_accum_steps
    fields: dict[str, object] = {"train.micro_batch_size": 1, "train.grad_accum_steps": accum}
    smaller = replace(w, micro_batch_size=1, grad_accum_steps=accum)
    change = f"micro-batch 1 x accumulation {accum} (the same global batch)"
    return [Suggestion(change, fields, _forecast(m, smaller, hw, cfg, s))]


def _full_checkpointing(
    m: ModelShape, w: Workload, hw: Hardware, cfg: Config, s: Strategy | None
) -> list[Suggestion]:
    if s is None or s.activation_checkpointing == "full":
        return []  # `auto` already weighs every checkpointing mode
    fields: dict[str, object] = {"parallel.activation_checkpointing": "full"}
    if s.activation_checkpointing == "first_k":
        fields["parallel.ac_blocks"] = None
    full = replace(s, activation_checkpointing="full", ac_blocks=None, ac_every=2)
    return [Suggestion("full activation checkpointing", fields, evaluate(m, w, hw, full))]


def _adapters(
    m: ModelShape, w: Workload, hw: Hardware, cfg: Config, s: Strategy | None
) -> list[Suggestion]:
    """LoRA (for a full fine-tune) and QLoRA (without a 4-bit base), at the config's rank or
    `RANK`, each where the config takes it (QLoRA refuses fp16 compute)."""
    lora, out = cfg.model.lora, []
    rank = lora.rank or RANK
    ways = [] if lora.rank else [(f"LoRA r={rank}", {"model.lora.rank": rank})]
    if lora.quantize == "none":
        ways.append((f"QLoRA r={rank}", {"model.lora.rank": rank, "model.lora.quantize": "nf4"}))
    gated = cfg.model.hf is not None and cfg.model.lean_ops
    for change, fields in ways:
        changed, engine = _taking(cfg, fields)
        if changed is None:
            continue
        quantized = "model.lora.quantize" in fields
        counted = (
            adapters_for(changed) if lora.rank else estimated_adapters(m, rank, quantized, gated)
        )
        o = _forecast(m, replace(w, lora=counted), hw, changed, s if engine else None)
        moved = {} if engine else {"parallel.backend": o.strategy.backend}
        out.append(Suggestion(change, {**fields, **moved}, o))
    return out


def _taking(cfg: Config, fields: dict[str, object]) -> tuple[Config | None, bool]:
    """`cfg` with `fields`, and whether its engine takes them; where it refuses them, the config
    with the planner to pick among the engines that do (`auto`); None where nothing takes them
    (QLoRA with fp16 compute)."""
    try:
        return with_fields(cfg, fields), True
    except UserError:
        pass
    try:
        return with_fields(cfg, {**fields, "parallel.backend": "auto"}), False
    except UserError:
        return None, False


def _offloading(hw: Hardware, cfg: Config, s: Strategy | None) -> list[Strategy]:
    """Every option set of the configured engine (every engine's under `auto`) with NVMe space
    assumed, so that those offloading to NVMe are listed too; at the configured checkpointing."""
    if s is None:
        return candidates(replace(hw, nvme=max(hw.nvme, 1)), cfg)
    eng = s.engine
    return [replace(s, options=o) for o in eng.candidates(eng.opts(cfg), hw.nodes, True)]


def _offload(
    m: ModelShape, w: Workload, hw: Hardware, cfg: Config, s: Strategy | None
) -> list[Suggestion]:
    """CPU offload and NVMe offload where the engine has them: the fastest that fits of each,
    else the one that needs the least GPU memory."""
    found = [evaluate(m, w, hw, x) for x in _offloading(hw, cfg, s)]
    kinds = {
        "CPU offload": [o for o in found if o.memory.host > 0 and o.memory.nvme <= 0],
        "NVMe offload": [o for o in found if o.memory.nvme > 0],
    }
    out = []
    for change, options in kinds.items():
        if options:
            o = _best(sorted(options, key=rank_key))
            fields = {k: v for k, v in o.strategy.overrides().items() if _current(cfg, k) != v}
            out.append(Suggestion(change, fields, o))
    return out


def _current(cfg: Config, key: str) -> object:
    """A field's value in `cfg`, `parallel.compile` as it resolves on a GPU."""
    if key == "parallel.compile":
        eng = engines().get(cfg.parallel.backend)  # None for `auto`: the engine is not known yet
        if eng is None:
            return compiles(cfg.parallel)
        return eng.compiles(eng.opts(cfg), cfg.parallel.compile, "cuda")
    try:
        return get_field(cfg, key)
    except AttributeError:
        return None


def _shorter(
    m: ModelShape, w: Workload, hw: Hardware, cfg: Config, s: Strategy | None
) -> list[Suggestion]:
    """The longest of seq_len / 2, / 4, ... (down to SHORTEST) that fits, else the shortest."""
    seq, last = w.seq_len // 2, None
    while seq >= SHORTEST:
        last = (seq, _forecast(m, replace(w, seq_len=seq), hw, cfg, s))
        if last[1].fits:
            break
        seq //= 2
    if last is None:
        return []
    seq, o = last
    return [Suggestion(f"seq_len {seq}", {"model.seq_len": seq}, o)]


CHANGES: tuple[Callable[..., list[Suggestion]], ...] = (
    _smaller_batch,
    _full_checkpointing,
    _adapters,
    _offload,
    _shorter,
)


def suggestions(
    m: ModelShape, w: Workload, hw: Hardware, cfg: Config, configured: Configured
) -> list[Suggestion]:
    """When the configured run does not fit: the same run with each change of `CHANGES`, with
    its forecast. Empty when it fits."""
    if configured.option.fits:
        return []
    s = None if configured.auto else configured.option.strategy
    at = configured.option.workload or w
    return [x for change in CHANGES for x in change(m, at, hw, cfg, s)]
