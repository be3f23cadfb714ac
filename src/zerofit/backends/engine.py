"""What every engine declares about itself, without importing torch or the engine library.

An `Engine` is the one place that knows an engine: its config section (`parallel.<name>.*`), how
it resolves a config before launch, its planner terms (memory components, communication, offload
time, efficiency), its doctor rule (the share of the parameters a rank should hold) and its OOM
remedies. Its runtime `Backend` (torch) is imported only when a run starts. `zerofit.backends`
holds the registry; nothing outside an engine's package compares engine names.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar

from zerofit.backends.terms import EngineMemory, HostCalls, OffloadTime, Traffic, Workload

if TYPE_CHECKING:
    from zerofit.backends.base import Backend
    from zerofit.config import Config
    from zerofit.models.shape import ModelShape
    from zerofit.planner.shape import Hardware

OptionsT = TypeVar("OptionsT")  # an engine's options: its `parallel.<name>` dataclass


@dataclass
class LaunchCheck:
    """What an engine says about a resolved config before any worker starts (`launch_check`)."""

    notes: list[str] = field(default_factory=list)  # one line each, printed as `note: ...`
    files: dict[str, str] = field(default_factory=dict)  # name -> text, kept in the run folder


def compiles_unless(compile_setting: bool | str, device_type: str, why_not: str | None) -> bool:
    """`parallel.compile` as a run resolves it: written `true`/`false` kept, `auto` on CUDA unless
    the engine gave a reason not to (`why_not`, its `Engine.uncompiled`)."""
    if compile_setting != "auto":
        return bool(compile_setting)
    return device_type == "cuda" and why_not is None


class Engine(Generic[OptionsT]):
    name: ClassVar[str]
    options: type[OptionsT]  # the dataclass of `parallel.<name>` (a class attribute)
    runtime_module: ClassVar[str]  # where its Backend lives (imports torch)
    checkpoint_format: ClassVar[str] = "dcp"
    # The package this engine runs on beyond torch (its version goes into benchmark records).
    library: ClassVar[str | None] = None
    # "module:Class" reading a checkpoint of a format other than DCP (model_dir -> StorageReader).
    checkpoint_reader: ClassVar[str | None] = None
    # Option fields the planner chooses (written by `zerofit plan --write`).
    plan_keys: ClassVar[tuple[str, ...]] = ()
    # Roofline: share of the peak the model FLOPs reach eager at hidden 2048, and torch.compile's gain.
    efficiency: ClassVar[float]
    compile_gain: ClassVar[float]
    # Under full activation checkpointing, each block's saved input is fp32 (autocast keeps the
    # master-dtype residual stream) rather than the compute dtype.
    fp32_checkpoints: ClassVar[bool] = False
    # The config key of the directory this engine offloads to NVMe in, if it can.
    nvme_dir_key: ClassVar[str | None] = None
    # The command that prints the file this engine's library runs from (`render_file`), if any.
    file_command: ClassVar[str | None] = None
    file_help: ClassVar[str] = ""

    # ------------------------------------------------------------------ config

    def opts(self, cfg: Config) -> OptionsT:
        """This engine's section of a config."""
        return getattr(cfg.parallel, self.name)

    def check_options(self, opts: OptionsT) -> None:
        """Refuse, at config load, a value in this engine's section that no run could use (a path
        the OS would refuse), whichever engine the run picks."""

    def validate(self, cfg: Config) -> None:
        """Refuse, at config load (UserError), settings this engine cannot run at all; what needs
        the world size or the device waits for `prepare` and `check_world`."""

    def prepare(self, cfg: Config, world_size: int, device_type: str) -> Config:
        """Engine-specific resolution before the config is saved (e.g. merge a ds_config.json).
        `cfg.precision` is already resolved."""
        return cfg

    def uncompiled(self, opts: OptionsT) -> str | None:
        """Why `parallel.compile: auto` stays off on a GPU with these options (None: it compiles
        there). A written `true` or `false` is kept whatever this says."""
        return None

    def compiles(self, opts: OptionsT, compile_setting: bool | str, device_type: str) -> bool:
        """Whether a run with these options and `parallel.compile` compiles on `device_type`:
        `auto` compiles on CUDA unless `uncompiled` says why not. The planner and a run's
        resolution both ask here."""
        return compiles_unless(compile_setting, device_type, self.uncompiled(opts))

    def launch_check(self, cfg: Config, world_size: int) -> LaunchCheck:
        """Check the files this engine's library will run from, for a resolved config, before
        any worker starts (UserError: one line); the notes to print once the run has passed
        every check, and the files to keep in the run folder."""
        return LaunchCheck()

    def check_world(self, opts: OptionsT, world_size: int) -> None:
        """Refuse a world size this engine's options cannot use."""

    def check_machine(
        self, cfg: Config, planned: Callable[[], EngineMemory], local_ranks: int
    ) -> None:
        """Refuse (UserError, one line), in the launcher before any rank starts, what this
        machine lacks for a resolved config: an op of the engine's library that cannot build, a
        directory it writes to that cannot take the run. `planned()`: the planner's bytes per
        rank (`memory` at the run's workload); `local_ranks`: the ranks on this node."""

    def replicas(self, opts: OptionsT) -> int:
        """Replicas on the outer dim of the device mesh (hybrid sharding), else 1."""
        return 1

    def own_keys(self) -> tuple[str, ...]:
        """Config key prefixes only this engine reads: `zerofit bench` sweeps them for it alone."""
        return (f"parallel.{self.name}.",)

    def runtime(self) -> type[Backend]:
        return importlib.import_module(self.runtime_module).BACKEND

    def render_file(self, cfg: Config, world_size: int) -> str:
        """The engine library's own config file for a resolved config (see `file_command`)."""
        raise NotImplementedError(f"{self.name} runs from no file of its own")

    def reader(self) -> Callable[[Path], Any] | None:
        """The class that reads this engine's checkpoint files when they are not DCP's."""
        if self.checkpoint_reader is None:
            return None
        module, name = self.checkpoint_reader.split(":")
        return getattr(importlib.import_module(module), name)

    def checkpoint_files(self, saved: dict[str, Any]) -> Iterator[tuple[str, ...]]:
        """The files under a checkpoint's ``model/`` that this engine's ``save`` writes, for the
        checkpoint's meta.json ``saved`` (in this engine's format): one entry a file, the names it
        may have. A verified checkpoint lacking one is damaged (`zerofit.checkpoint.verify`).
        DCP: ``.metadata``, and one ``__<rank>_0.distcp`` per rank (written even when empty).
        ValueError when ``saved`` is no layout of this format."""
        yield (".metadata",)
        for rank in range(saved["world_size"]):
            yield (f"__{rank}_0.distcp",)

    # ------------------------------------------------------------------ planner

    def candidates(self, base: OptionsT, nodes: int, nvme: bool) -> list[OptionsT]:
        """The option sets `zerofit plan` compares on `nodes` nodes (with NVMe space or not),
        varied from `base`, the config's own section (its other settings are kept)."""
        return [base]

    def tunings(self, opts: OptionsT) -> list[OptionsT]:
        """Variants of one candidate that the planner chooses between for a fixed global batch
        (it takes the fastest that fits); `[opts]` when there is nothing to tune."""
        return [opts]

    def label(self, opts: OptionsT) -> str:
        raise NotImplementedError

    def memory(self, m: ModelShape, w: Workload, opts: OptionsT) -> EngineMemory:
        raise NotImplementedError

    def traffic(self, m: ModelShape, w: Workload, opts: OptionsT) -> Traffic:
        raise NotImplementedError

    def offload_seconds(
        self, m: ModelShape, w: Workload, opts: OptionsT, hw: Hardware
    ) -> OffloadTime:
        """Host-side optimizer and PCIe/NVMe time: per micro-batch and per optimizer step (none
        without offload)."""
        return OffloadTime()

    def host_calls(self, m: ModelShape, w: Workload, opts: OptionsT) -> HostCalls:
        """Python hook calls per micro-batch and per optimizer step (`HostCalls`); none where
        the engine's hooks run in C++ (DDP's reducer)."""
        return HostCalls()

    def hook_for_probe(
        self, model: Any, blocks: Any, variant: str = ""
    ) -> tuple[Callable[[Any], None], int] | None:
        """This engine's hooks on `model` (zerofit's Llama in fp32, each of `blocks` a unit) over
        the process group in use (the host probe's fake one), as a run of `variant` (one of
        `hook_variants`) applies them, for `zerofit.planner.host_probe` to time its hook calls
        on this host: (a forward + backward of a token batch, the hook calls `host_calls`
        counts a unit as); None where it has no Python hooks to time (or its library is
        missing)."""
        return None

    def hook_variants(self) -> dict[str, bool]:
        """The kinds of run whose hooks cost differently a call, each probed apart: variant ->
        whether its blocks are compiled (the probe then compares them with compiled plain
        blocks, on a GPU only). "" is the engine's plain eager run."""
        return {"": False}

    def hook_variant(self, opts: OptionsT, compiled: bool, accumulating: bool = False) -> str:
        """Which of `hook_variants` a run with `opts` (compiled or not) is: its probed hook rate
        is that variant's (`zerofit.planner.speed.host_rates`); `accumulating`: the variant of
        its micro-batches before the step's last (`HostCalls.accumulating`)."""
        return ""

    def host_optimizers_for_probe(self) -> dict[str, Callable[..., Any]]:
        """The offloaded optimizer steps an offloading run of this engine takes on the host, each
        under the key its `offload_seconds` reads the rate of (`Hardware.adam_bw`), for
        `zerofit.planner.optimizer_probe` to time: each makes, from a parameter count and the
        device, (a step that returns its seconds, the parameters it steps). Empty where nothing
        offloads (or a library is missing)."""
        return {}

    # ------------------------------------------------------------------ doctor

    def shard_share(self, opts: OptionsT, world_size: int) -> float:
        """The share of the parameters each rank should hold."""
        return 1.0

    def unsharded(self, opts: OptionsT, world_size: int) -> tuple[str, str] | None:
        """When a rank holds every parameter on several ranks: (status, why), or None when this
        engine never shards parameters (no finding)."""
        return None

    def remedies(self, cfg: Config) -> list[tuple[str, dict[str, Any]]]:
        """OOM next steps this engine offers: (what to do, config fields to set)."""
        return []
