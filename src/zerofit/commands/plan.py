"""`zerofit plan`: per-GPU memory and speed of every strategy, the run as configured, the
recommendation, `--write` and `--measure`. Its inputs are read in `plan_args`, its table printed by
`plan_table`, its config written by `plan_write`."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from functools import partial
from typing import NoReturn, TextIO

import zerofit.commands.plan_args as plan_args
import zerofit.commands.plan_measure as plan_measure
import zerofit.commands.plan_write as plan_write
import zerofit.planner.disk as disk
from zerofit.backends import engines
from zerofit.backends.terms import GIB, Workload
from zerofit.commands.plan_table import configured_lines, print_tables
from zerofit.config import Config
from zerofit.config.sizes import memory_fraction
from zerofit.errors import UserError
from zerofit.models.shape import ModelShape, shape_from_config
from zerofit.planner.adapters import lighter_lines, lighter_ways
from zerofit.planner.configured import as_configured, suggestions
from zerofit.planner.plan import batch_splits, left_out, plan, recommend
from zerofit.planner.plan_json import option_json, to_json
from zerofit.planner.shape import Hardware, detect_hardware, host_ram, with_gpu, with_host
from zerofit.report.quiet import data_output


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "plan",
        help="per-GPU memory and speed of every strategy, and which to use",
        description="Forecast per-GPU memory (by component) and speed for DDP, FSDP and ZeRO, "
        "say what fits, and recommend. Config keys are flags too, as for `zerofit train`: "
        "--model.hf DIR, --model.lora.rank 16, --parallel.activation_checkpointing full.",
    )
    plan_args.add_arguments(p)
    plan_measure.add_arguments(p)
    p.error = _one_line_error  # type: ignore[method-assign]
    p.set_defaults(run=run, takes_overrides=True)


def _one_line_error(message: str) -> NoReturn:
    """argparse's own errors (a flag without its value) as one `error:` line and exit 2, like
    every UserError, instead of the usage text."""
    if "expected one argument" in message:
        message += " (give it a value; one that starts with '-' goes as --flag=VALUE)"
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def run(args: argparse.Namespace, overrides: list[str]) -> int:
    if not args.json:
        return cmd_plan(args, sys.stdout, overrides)
    with data_output() as stdout:  # the JSON alone on stdout, whatever the libraries print
        return cmd_plan(args, stdout, overrides)


def _hardware(
    args: argparse.Namespace, limit: int | None = None
) -> tuple[Hardware, Hardware | None]:
    """The machine planned for: detected here, with every flag given replacing what it names;
    the host RAM always known when this machine says it (detected when --cpu-mem is not given);
    the GPU memory --gpu-mem's, else the config's train.gpu_memory_limit (`limit`: refused above
    the card detected here), else the card's. Returns it and the machine detected (or None)."""
    found = detect_hardware()
    if args.gpu_mem is None and limit is not None and found is not None and args.gpu is None:
        memory_fraction(limit, found.gpu_mem, found.name)  # as the run would refuse it
    memory = args.gpu_mem or limit
    memory_from = "--gpu-mem" if args.gpu_mem else "train.gpu_memory_limit"
    if args.gpus is None and found is None:
        raise UserError(
            "no GPU detected here: give --gpus N and --gpu-mem SIZE or --gpu NAME "
            "(e.g. --gpus 8 --gpu-mem 80GB, or --gpus 2 --gpu 'RTX 4090')"
        )
    if memory is None and args.gpu is None and found is None:
        raise UserError("no GPU detected here: give --gpu-mem SIZE or --gpu NAME too")
    hw = found or Hardware(gpus_per_node=args.gpus, gpu_mem=0)
    if args.gpu is not None:
        hw = replace(with_gpu(hw, args.gpu), gpu_from="--gpu")
    if args.peak_tflops is not None:
        given = "--peak-tflops" if hw.gpu_from != "--gpu" else "--gpu, --peak-tflops"
        hw = replace(hw, peak_flops=args.peak_tflops * 1e12, gpu_from=given)
    if args.cpu_mem is not None:
        ram, ram_from = args.cpu_mem, "given"
    elif found is not None:
        ram, ram_from = found.cpu_mem, found.cpu_mem_from
    else:
        ram = host_ram()
        ram_from = "detected" if ram is not None else "unknown"
    planned = replace(
        hw,
        gpus_per_node=args.gpus or hw.gpus_per_node,
        gpu_mem=memory or hw.gpu_mem,
        gpu_mem_from=memory_from if memory else "card",
        cpu_mem=ram,
        cpu_mem_from=ram_from,
        nvme=args.nvme if args.nvme is not None else hw.nvme,
        nodes=args.nodes,
    )
    return planned, found


def _probe_dir(given: str | None, base: Config) -> str | None:
    """`--nvme-probe [DIR]`: DIR, or the config's NVMe directory; None when not asked."""
    if given is None or given:
        return given
    found = disk.nvme_dir(base)
    if found is None:
        keys = " or ".join(k for e in engines().values() if (k := e.nvme_dir_key))
        raise UserError(f"--nvme-probe: give a directory, or set {keys} in the config")
    return found


def _with_host(hw: Hardware, given: tuple[float, ...] | None, probing: bool) -> Hardware:
    """The host's launch and hook rates: `--host-us`'s, or timed here (`--host-probe`)."""
    if given is not None:
        compiled = given[2] if len(given) > 2 else None
        return with_host(hw, given[0], given[1], compiled, source="--host-us")
    if not probing:
        return hw
    from zerofit.planner import host_probe  # why: imports torch; only --host-probe needs it

    found = host_probe.probe()
    for name, why in found.failed.items():
        print(
            f"note: --host-probe could not time {name} ({why}): fitted rate kept", file=sys.stderr
        )
    hooks, adam = tuple(found.hooks.items()), tuple(found.adam_bw.items())
    where = f"probed: {found.where}"
    if found.pcie_bw is not None:  # the copies offloading runs make, timed here
        hw = replace(hw, pcie_bw=found.pcie_bw)
    return with_host(hw, found.launch_s, None, found.compiled_launch_s, hooks, where, adam)


def objective_lines(base: Config, w: Workload, m: ModelShape | None = None) -> list[str]:
    """What the objective adds to the forecasts above: DPO's reference (`m`: the model's shape,
    for the size of a frozen copy; read from `base` when not given)."""
    if base.train.objective != "dpo":
        return []
    if w.reference_copy:
        size = (m or shape_from_config(base)).num_params * w.e_c / GIB
        return [f"DPO: the reference is a frozen copy of the model ({size:.2f} GiB of weights in "
                "the compute dtype, sharded as each engine shards the policy's): in the memory "
                "above, and one more forward a micro-batch, without gradients, in the speeds"]  # fmt: skip
    if w.reference_forward:
        return ["DPO: the reference is the base with the adapters off: one more forward a "
                "micro-batch, without gradients (in the speeds above; no memory beyond a forward's)"]  # fmt: skip
    return ["DPO: the reference log-probs are precomputed before the first step (one forward over "
            "every pair; 8 bytes a pair, in the run folder): no step time or memory above"]  # fmt: skip


def cmd_plan(args: argparse.Namespace, stdout: TextIO, overrides: list[str] | None = None) -> int:
    args = plan_args.numbers(args)
    measuring = plan_measure.settings(args)  # checked before anything runs
    shape, base = plan_args.model_and_base(args, overrides or [])
    hw, found = _hardware(args, base.train.gpu_memory_limit)
    hw = disk.with_disk(hw, args.nvme_bw, _probe_dir(args.nvme_probe, base))
    hw = _with_host(hw, args.host_us, args.host_probe)
    w = plan_args.workload(args, base, hw, shape)
    fixed = args.global_batch or base.train.global_batch_size
    splits = None
    if fixed is not None:
        splits = batch_splits(fixed, hw.world_size, args.micro_batch, args.grad_accum)
    options = plan(shape, w, hw, base, splits)
    refused = left_out(base)
    best = recommend(options)
    configured = as_configured(shape, w, hw, base, options, splits)
    suggested = suggestions(shape, w, hw, base, configured)
    ways = lighter_ways(shape, w, hw, base) if best is None else []
    shown = [o for o in (best, configured.option) if o is not None]
    nvme_lines, nvme_data = disk.report(shape, w, hw, base, splits, shown)
    if args.json:
        data = to_json(shape, w, hw, options, fixed, refused, configured, suggested)
        data["nvme"] = nvme_data
        data["with_adapters"] = [{"way": x.name, "overrides": x.overrides, "fits": x.fits,
                                  **option_json(x.best, w)} for x in ways]  # fmt: skip
        print(json.dumps(data, indent=1), file=stdout)
    else:
        say = print_tables(shape, w, hw, options, args.all, fixed, refused, configured)
        total = len(options) + (configured.listed is None)
        lines = configured_lines(configured, suggested, w, total)
        lines += objective_lines(base, w, shape)
        lines += nvme_lines
        if ways:
            lines.append("full fine-tuning fits nowhere here; the same run with adapters:")
            lines += [f"  {line}" for line in lighter_lines(ways)]
        say(lines)
    if args.write:
        plan_write.write(args, base, w, best, hw, found, fixed)
    if measuring:
        config_of = partial(plan_write.recommended_config, base, w)
        plan_measure.measure(measuring, args.json, shape, w, hw, options, config_of)
    return 0
