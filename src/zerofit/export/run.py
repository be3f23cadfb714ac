"""``zerofit export``: a Hugging Face model folder from any zerofit checkpoint, offline.

Whatever engine wrote the checkpoint (DDP/FSDP: DCP files; DeepSpeed ZeRO: its own), tensors are
read through the engine-neutral view one at a time, cast, and written into safetensors shards of at
most ``max_shard_bytes`` (peak host memory: about one shard plus one tensor), with their index,
``config.json``, ``generation_config.json`` and the run's tokenizer files. Everything that can fail
on input is checked first (manifest, meta, every name and shape against the HF model's), and the
folder is written as ``<out>.tmp-<pid>``, renamed at the end. The built-in Llama maps onto
``LlamaForCausalLM`` by name alone: its RoPE is HF's "rotate half" layout (no q/k permutation).
A LoRA run exports merged, or as a PEFT adapter folder (``zerofit.export.lora``).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import warnings
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import safetensors.torch
import torch

from zerofit.backends import checkpoint_readers
from zerofit.checkpoint import (
    checkpoint_root,
    complete_checkpoints,
    manifest,
    step_dir,
    step_dirs,
    verify,
)
from zerofit.checkpoint.compat import first_difference
from zerofit.checkpoint.manifest import MANIFEST
from zerofit.checkpoint.neutral import MODEL, NeutralView, open_reader
from zerofit.config import Config, sizes
from zerofit.data import load_tokenizer
from zerofit.errors import UserError
from zerofit.export.hf import hf_parameters, llama_config, llama_to_hf, set_dtype
from zerofit.export.lora import (
    PEFT_PREFIX,
    LoRAInfo,
    Reader,
    adapter_config,
    adapter_tensors,
    base_names,
    dequantized,
    lora_info,
    merged_reader,
    write_adapter,
)
from zerofit.launch.run_config import load_config
from zerofit.models.hf import fingerprint
from zerofit.models.hf import load_config as load_hf_config

if TYPE_CHECKING:
    from transformers import PretrainedConfig

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
TOKENIZER_FILES = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
    "tokenizer.model", "vocab.json", "merges.txt", "chat_template.jinja",
)  # fmt: skip
HF_PREFIX = "hf."


def parse_size(text: str) -> int:
    """A shard size ('5GB', '20MiB', '1000'): `zerofit.config.sizes.parse_size`, at least one byte."""
    return sizes.parse_size(text, minimum=1)


def read_run_config(run_dir: Path) -> Config:
    if not run_dir.is_dir():
        raise UserError(f"no such run directory: {run_dir}")
    if not (run_dir / "config.yaml").is_file():
        raise UserError(f"{run_dir} is not a zerofit run directory (no config.yaml)")
    return load_config(run_dir / "config.yaml")


def find_checkpoint(run_dir: Path, step: int | None) -> Path:
    """The newest complete checkpoint of a run (or the one at ``step``); UserError naming what exists."""
    cfg = read_run_config(run_dir)
    root = checkpoint_root(cfg.checkpoint.dir, run_dir)
    found = step_dirs(root)
    have = ", ".join(p.name for p in found) or "none"
    if step is not None:
        ckpt = step_dir(root, step)
        if not ckpt.is_dir():
            raise UserError(f"no checkpoint at step {step} under {root} (there: {have})")
        if not (ckpt / manifest.MANIFEST).is_file():
            raise UserError(f"checkpoint {ckpt} is incomplete (no {manifest.MANIFEST})")
        return ckpt
    done = complete_checkpoints(root)
    if not done:
        raise UserError(f"no complete checkpoint under {root} (step directories there: {have})")
    return done[-1]


def hf_run_config(cfg: Config, meta: dict[str, Any]) -> PretrainedConfig:
    """The run's Hugging Face config: its folder's, with the run's overrides applied."""
    if not cfg.model.hf:
        raise UserError("the checkpoint holds a Hugging Face model but config.yaml has no model.hf")
    config = load_hf_config(cfg.model.hf, cfg.model.overrides, cfg.model.trust_remote_code)
    saved, now = meta.get("model", {}).get("config") or {}, fingerprint(config)["config"]
    common = saved.keys() & now.keys()  # another transformers version may add or drop keys
    where = first_difference({k: saved[k] for k in common}, {k: now[k] for k in common})
    if where is not None:
        raise UserError(
            f"{cfg.model.hf}/config.json changed since the run was trained ({where} differs)"
        )
    return config


def plan_tensors(
    view: NeutralView, config: PretrainedConfig, builtin: bool, params: tuple | None = None
) -> list[tuple[str, str]]:
    """(neutral key, Hugging Face name) for every tensor but LoRA adapters, in the HF model's
    order; checked. ``params``: ``hf_parameters(config)``, if already known.

    Sets ``config.architectures`` when the config does not name its model class.
    """
    arch, shapes, aliases = params or hf_parameters(config)
    config.architectures = getattr(config, "architectures", None) or [arch]
    mapped: dict[str, str] = {}
    for name in base_names(view):
        hf = llama_to_hf(name) if builtin else name.removeprefix(HF_PREFIX)
        if hf is None or (not builtin and not name.startswith(HF_PREFIX)):
            raise UserError(f"checkpoint {view.where} has a parameter {name!r} foreign to the run")
        if hf not in aliases:
            mapped[hf] = MODEL + name
    missing = [n for n in shapes if n not in mapped]
    extra = [n for n in mapped if n not in shapes]
    if missing or extra:
        what = f"lacks {missing[0]}" if missing else f"has {extra[0]}, unknown to"
        raise UserError(
            f"checkpoint {view.where} {what} {arch} ({len(missing)} missing, {len(extra)} extra)"
        )
    for hf, key in mapped.items():
        if view.entries[key][0] != shapes[hf]:
            raise UserError(
                f"checkpoint {view.where}: {key} has shape {view.entries[key][0]}, {arch} wants {shapes[hf]}"
            )
    return [(mapped[n], n) for n in shapes]


def tokenizer_files(cfg: Config) -> tuple[dict[str, Path], str]:
    """The run's tokenizer files (name in the export -> file), and a note saying what is exported."""
    spec = cfg.data.tokenizer
    if spec == "byte":
        note = "none (byte tokenizer: ids 0-255 are UTF-8 bytes, 256 is EOS; no files)"
        if cfg.model.hf and any((Path(cfg.model.hf) / n).is_file() for n in TOKENIZER_FILES):
            note += f"; the tokenizer in {cfg.model.hf} was not used in training, so not copied"
        return {}, note
    path = Path(spec).expanduser()
    folder = path if path.is_dir() else path.parent
    main = path / "tokenizer.json" if path.is_dir() else path
    if not main.is_file():
        raise UserError(f"the run's tokenizer {main} (data.tokenizer) is not there any more")
    extra = {n: folder / n for n in TOKENIZER_FILES[1:] if (folder / n).is_file()}
    files = {"tokenizer.json": main, **extra}
    return files, ", ".join(files)


def plan_shards(sizes: list[int], max_bytes: int) -> list[list[int]]:
    """Consecutive index groups of at most ``max_bytes`` (a larger tensor gets a shard alone)."""
    shards: list[list[int]] = [[]]
    used = 0
    for i, size in enumerate(sizes):
        if shards[-1] and used + size > max_bytes:
            shards.append([])
            used = 0
        shards[-1].append(i)
        used += size
    return shards


def write_shards(
    read: Reader, tensors: list[tuple[str, str]], shards: list[list[int]], dtype: torch.dtype, out: Path
) -> dict[str, str]:  # fmt: skip
    """Read (``read(key, dtype)``: LoRA merged), cast and write one shard at a time; returns the
    weight map (HF name -> file)."""
    weight_map = {}
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "torch.distributed is disabled")  # DCP's no_dist read
        for k, shard in enumerate(shards, start=1):
            fname = f"model-{k:05d}-of-{len(shards):05d}.safetensors"
            batch = {}
            for key, hf in (tensors[i] for i in shard):
                batch[hf] = read(key, dtype).contiguous()
                weight_map[hf] = fname
            safetensors.torch.save_file(batch, str(out / fname), metadata={"format": "pt"})
            del batch
    return weight_map


@dataclass
class ExportPlan:
    """Everything checked and decided before a byte is written."""

    meta: dict[str, Any]
    view: NeutralView
    config: PretrainedConfig
    tensors: list[tuple[str, str]]  # (neutral key, HF name), in the HF model's order
    sizes: list[int]  # bytes of each tensor in the export dtype
    tokenizer: dict[str, Path]  # file name in the export -> the run's file
    tokenizer_note: str
    cfg: Config
    builtin: bool  # the zerofit Llama (else a model.hf folder)
    shapes: dict[str, tuple[int, ...]]  # the HF model's parameters
    lora: LoRAInfo | None


def plan_export(ckpt_dir: Path, run_dir: Path, dtype: str) -> ExportPlan:
    """Validate the run and checkpoint (manifest, meta, every name and shape); plan the export."""
    if dtype not in DTYPES:
        raise UserError(f"unknown export dtype {dtype!r} (choices: {', '.join(DTYPES)})")
    cfg = read_run_config(run_dir)
    meta = verify(ckpt_dir)  # every byte against the manifest, then meta.json
    view = NeutralView(
        open_reader(ckpt_dir / "model", meta["format"], checkpoint_readers()), ckpt_dir
    )
    view = dequantized(meta, view)  # a QLoRA base: its bf16 weights
    model_meta = meta.get("model") or {}
    builtin = model_meta.get("source", "hf" if cfg.model.hf else "zerofit-llama") != "hf"
    files, note = tokenizer_files(cfg)
    if builtin:
        if "args" not in model_meta:
            raise UserError(f"checkpoint {ckpt_dir}: meta.json does not describe the model")
        config = llama_config(model_meta["args"], load_tokenizer(cfg.data.tokenizer).eos_id)
    else:
        config = hf_run_config(cfg, meta)
    set_dtype(config, DTYPES[dtype])
    params = hf_parameters(config, cfg.model.trust_remote_code and not builtin)
    tensors = plan_tensors(view, config, builtin, params)
    itemsize = DTYPES[dtype].itemsize
    sizes = [itemsize * math.prod(view.entries[key][0]) for key, _ in tensors]
    lora = lora_info(meta, view)
    return ExportPlan(
        meta, view, config, tensors, sizes, files, note, cfg, builtin, params[1], lora
    )


EXPORTS = "export"  # a run's own folder of Hugging Face exports (checkpoint.export_final)


def _check_out(out: Path) -> None:
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UserError(f"--out {out} already exists and is not empty")


def _zerofit_folder(out: Path, ckpt_dir: Path, run_dir: Path) -> str | None:
    """The run or checkpoint folder that `out` (resolved) lies in, if any: this run's folder or
    checkpoint root, any folder with a checkpoint manifest, or any run folder (a config.yaml
    beside a checkpoints folder or metrics.jsonl). A later resume or save there would treat the
    export as damage, or delete it. This run's own ``export/`` folder (EXPORTS), where
    ``checkpoint.export_final`` writes, is the one place inside a run that is allowed."""
    if out.is_relative_to(run_dir.resolve() / EXPORTS):
        return None
    own = {
        run_dir.resolve(): "the run being exported",
        ckpt_dir.resolve().parent: "its checkpoints",
    }
    for folder in (out, *out.parents):
        if folder in own:
            return f"{own[folder]} ({folder})"
        if (folder / MANIFEST).exists():
            return f"the checkpoint {folder}"
        marks = (folder / "checkpoints").is_dir() or (folder / "metrics.jsonl").is_file()
        if (folder / "config.yaml").is_file() and marks:
            return f"the run {folder}"
    return None


def _write_model(plan: ExportPlan, folder: Path, dtype: str, shards: list[list[int]]) -> None:
    """config.json, generation_config.json, the shards (LoRA merged) and tokenizer files."""
    from transformers import GenerationConfig  # optional: transformers (the hf extra)

    plan.config.save_pretrained(folder)
    GenerationConfig.from_model_config(plan.config).save_pretrained(folder)
    read = merged_reader(plan.view, plan.lora)
    weight_map = write_shards(read, plan.tensors, shards, DTYPES[dtype], folder)
    index = {"metadata": {"total_size": sum(plan.sizes)}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    for name, src in plan.tokenizer.items():
        shutil.copy2(src, folder / name)


def _write_adapter(
    plan: ExportPlan, folder: Path, out: Path, dtype: str, shards: list[list[int]]
) -> int:
    """The PEFT adapter folder (written in ``folder``, to be renamed ``out``); a built-in
    preset's base, unmerged, goes into its ``base`` folder. Returns the adapter's bytes."""
    assert plan.lora is not None
    if plan.builtin:
        _write_model(replace(plan, lora=None), folder / "base", dtype, shards)
        base, hf_name = str(out / "base"), llama_to_hf
    else:
        base = str(Path(plan.cfg.model.hf).expanduser().resolve())
        hf_name = partial(_strip, HF_PREFIX)
    tensors = adapter_tensors(plan.lora, plan.view, hf_name, plan.shapes)
    hf_modules = [name.removeprefix(PEFT_PREFIX).rsplit(".", 2)[0] for _, name in tensors[::2]]
    linear = {n.removesuffix(".weight") for n, s in plan.shapes.items() if len(s) == 2}
    config = adapter_config(plan.lora, hf_modules, linear, plan.cfg.model.lora.dropout, base)
    for name, src in plan.tokenizer.items():
        shutil.copy2(src, folder / name)
    return write_adapter(plan.view, tensors, DTYPES[dtype], config, folder)


def _strip(prefix: str, name: str) -> str | None:
    return name.removeprefix(prefix) if name.startswith(prefix) else None


def export_checkpoint(
    ckpt_dir: Path, run_dir: Path, out: Path, dtype: str = "bf16", max_shard_bytes: int = 5 * 2**30,
    adapter: bool = False,
) -> dict[str, Any]:  # fmt: skip
    """Write a Hugging Face folder for ``ckpt_dir`` (of the run in ``run_dir``) at ``out``: with
    LoRA, the adapters merged, or (``adapter``) a PEFT adapter folder."""
    out = out.resolve()
    _check_out(out)
    inside = _zerofit_folder(out, ckpt_dir, run_dir)
    if inside:
        raise UserError(f"--out {out} is inside {inside}: export outside any run folder")
    plan = plan_export(ckpt_dir, run_dir, dtype)
    if adapter and plan.lora is None:
        raise UserError(f"--adapter: {run_dir} trained no LoRA adapters (model.lora.rank is 0)")
    shards = plan_shards(plan.sizes, max_shard_bytes)
    tmp = out.with_name(f"{out.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        written = _write_adapter(plan, tmp, out, dtype, shards) if adapter else 0
        if not adapter:
            _write_model(plan, tmp, dtype, shards)
        _check_out(out)
        if out.is_dir():
            out.rmdir()
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    lora = plan.lora
    return {
        "out": str(out), "checkpoint": str(ckpt_dir), "step": plan.meta["step"],
        "architecture": plan.config.architectures[0], "tensors": len(plan.tensors),
        "shards": len(shards), "total_bytes": written or sum(plan.sizes), "dtype": dtype,
        "tokenizer_files": list(plan.tokenizer), "tokenizer": plan.tokenizer_note,
        "lora": None if lora is None else {"rank": lora.rank, "alpha": lora.alpha,
                                           "layers": len(lora.modules), "adapter": adapter},
        "base": str(out / "base") if adapter and plan.builtin else None,
    }  # fmt: skip
