"""The stock stack on the same fine-tuning batches as zerofit: transformers + (PEFT) + FSDP2.

    torchrun --nproc-per-node 1 benchmarks/stock_sft.py -c CONFIG.yaml --out DIR [--liger]
        [--compile] [zerofit overrides]

What "the usual way" means here, as a TRL / Accelerate user would run it:
- `AutoModelForCausalLM.from_config` of the zerofit config's `model.hf` folder, attention "sdpa",
  weights fp32 (full fine-tune: fp32 master weights and AdamW states) or bf16 (LoRA: the frozen
  base in bf16, PEFT's adapters upcast to fp32), random init (zerofit's runs init the same shape);
- LoRA through `peft.get_peft_model` with the config's rank, alpha, dropout and targets;
- `fully_shard` on every decoder layer, then the root, with bf16 compute and fp32 reduction;
  activation checkpointing per decoder layer when `parallel.activation_checkpointing` is not none;
- the loss as transformers computes it: fp32 logits of every position, cross-entropy ignoring
  -100, the mean over each micro-batch's valid tokens;
- `--liger`: Liger Kernel on the model instance before PEFT and sharding
  (`_apply_liger_kernel_to_instance`: fused linear cross-entropy, RMSNorm, SwiGLU, RoPE), the loss
  then from the model's own forward with the already shifted targets (`shift_labels`);
- `--compile`: `torch.compile` on each decoder layer (after activation checkpointing, before
  `fully_shard`, torchtitan's order);
- `--qlora`: QLoRA as bitsandbytes trains it: every linear layer but the head becomes a
  `bitsandbytes.nn.Linear4bit` (NF4, double-quantised statistics, bf16 compute: the modules
  `from_pretrained(..., quantization_config=BitsAndBytesConfig(load_in_4bit=True,
  bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True, bnb_4bit_compute_dtype=bf16))`
  builds), quantised here from the bf16 random init on the GPU; PEFT's adapters on top; on one GPU
  no FSDP (HF Trainer's single-GPU way: autocast to bf16, adapters kept in fp32), gradient
  checkpointing per decoder layer when `parallel.activation_checkpointing` is not none;
- `--memory-limit-gib G`: cap the caching allocator at G GiB (a 24 GB card rehearsed on a larger
  one, as zerofit's `train.gpu_memory_limit` does); peak memory is then read after the model is
  built (`load_peak_gib` reports the build's);
- torch.optim.AdamW (fused) over the trainable parameters, the config's lr schedule (zerofit's
  warm-up and cosine, so both stacks take the same steps) and grad clipping.

The batches are zerofit's own (`zerofit.train.inputs.build_inputs` + `make_loader`): the same chat
rows, masks and packed position ids (transformers keeps packed documents apart when it sees
position ids restart), so both stacks see the same data. Tokens per second count target tokens
that are not padding ("real tokens", `zerofit.data.real_tokens`, as zerofit's own summary counts
them) beside all places; MFU uses zerofit's FLOPs per token and peak (989 TFLOP/s on an H200).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F


def parse() -> tuple[argparse.Namespace, list[str]]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("-c", "--config", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument(
        "--attn", default="sdpa", help="transformers attn_implementation (sdpa, flex_attention)"
    )
    p.add_argument("--liger", action="store_true", help="Liger Kernel (see the module doc)")
    p.add_argument("--compile", action="store_true", help="torch.compile each decoder layer")
    p.add_argument("--qlora", action="store_true", help="bitsandbytes 4-bit base (module doc)")
    p.add_argument("--memory-limit-gib", type=float, default=None, help="cap the allocator")
    return p.parse_known_args()


def quantize_bnb(model: torch.nn.Module, device: torch.device) -> int:
    """Every nn.Linear but the head as bitsandbytes' NF4 Linear4bit; the count replaced."""
    import bitsandbytes as bnb

    count = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is not torch.nn.Linear or name == "lm_head":
                continue
            q = bnb.nn.Linear4bit(
                child.in_features, child.out_features, bias=child.bias is not None,
                compute_dtype=torch.bfloat16, compress_statistics=True, quant_type="nf4",
                device="meta",
            )  # fmt: skip
            q.weight = bnb.nn.Params4bit(
                child.weight.data, requires_grad=False, quant_type="nf4",
                compress_statistics=True, module=q,
            ).to(device)  # fmt: skip
            if child.bias is not None:
                q.bias = child.bias
            setattr(parent, name, q)
            count += 1
    torch.cuda.empty_cache()
    return count


def build_model(cfg, device: torch.device, attn: str, liger: bool = False, qlora: bool = False):  # noqa: ANN001, ANN201
    from transformers import AutoConfig, AutoModelForCausalLM

    hf_cfg = AutoConfig.from_pretrained(cfg.model.hf, local_files_only=True)
    hf_cfg.use_cache = False
    lora = cfg.model.lora.rank > 0
    dtype = torch.bfloat16 if lora else torch.float32
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(hf_cfg, attn_implementation=attn, dtype=dtype)
    if liger:
        from liger_kernel.transformers import _apply_liger_kernel_to_instance

        _apply_liger_kernel_to_instance(
            model=model, rope=True, rms_norm=True, swiglu=True, fused_linear_cross_entropy=True
        )
    if qlora:
        print(f"bitsandbytes NF4: {quantize_bnb(model, device)} linear layers", flush=True)
        if cfg.parallel.activation_checkpointing != "none":
            model.gradient_checkpointing_enable(
                gradient_checkpointing_kwargs={"use_reentrant": False}
            )
    if lora:
        from peft import LoraConfig, get_peft_model

        t = cfg.model.lora.targets
        model = get_peft_model(
            model,
            LoraConfig(
                r=cfg.model.lora.rank,
                lora_alpha=cfg.model.lora.alpha,
                lora_dropout=cfg.model.lora.dropout,
                target_modules="all-linear" if t == "all-linear" else list(t),
                task_type="CAUSAL_LM",
            ),
        )
    return model


def shard(model, cfg, compile_layers: bool = False) -> None:  # noqa: ANN001
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    layers = [m for m in model.modules() if type(m).__name__.endswith("DecoderLayer")]
    if cfg.parallel.activation_checkpointing != "none":
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
            apply_activation_checkpointing,
        )

        apply_activation_checkpointing(model, check_fn=lambda m: m in set(layers))
        layers = [m for m in model.modules() if type(m).__name__.endswith("DecoderLayer")]
    if compile_layers:
        for layer in layers:
            layer.compile()
    for layer in layers:
        fully_shard(layer, mp_policy=mp)
    fully_shard(model, mp_policy=mp)


def micro_loss(model, batch, device: torch.device, liger: bool = False) -> torch.Tensor:  # noqa: ANN001
    tokens, targets, positions = (t.to(device, non_blocking=True) for t in batch)
    if liger:  # Liger's forward: the fused head + loss on the shifted targets, no logits
        out = model(input_ids=tokens, position_ids=positions, shift_labels=targets, use_cache=False)
        return out.loss
    logits = model(input_ids=tokens, position_ids=positions, use_cache=False).logits
    return F.cross_entropy(
        logits.float().flatten(0, 1), targets.flatten(), ignore_index=-100
    )  # transformers' ForCausalLMLoss upcasts the same way


def main() -> int:
    args, overrides = parse()
    from zerofit.data import real_tokens
    from zerofit.launch.run_config import load_config
    from zerofit.report.metrics import peak_flops
    from zerofit.train.inputs import build_inputs, make_loader
    from zerofit.train.lr_schedule import lr_at

    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
    torch.cuda.set_device(device)
    steps = f"train.steps={args.warmup + args.steps}"  # as `zerofit bench` sets it (the schedule)
    cfg = load_config(args.config, [*overrides, steps])
    inputs = build_inputs(cfg)
    loader = make_loader(cfg, inputs.data, rank, world)
    torch.manual_seed(cfg.train.seed)
    if args.memory_limit_gib:
        total = torch.cuda.get_device_properties(device).total_memory
        torch.cuda.set_per_process_memory_fraction(args.memory_limit_gib * 2**30 / total, device)
    model = build_model(cfg, device, args.attn, args.liger, args.qlora)
    if args.qlora and world == 1:  # one GPU: no FSDP (bitsandbytes' documented single-GPU way)
        layers = [m for m in model.modules() if type(m).__name__.endswith("DecoderLayer")]
        for layer in layers if args.compile else []:
            layer.compile()
    else:
        shard(model, cfg, args.compile)
    load_peak = torch.cuda.max_memory_allocated() / 2**30
    built = torch.cuda.memory_allocated() / 2**30
    torch.cuda.reset_peak_memory_stats(device)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(
        params, lr=cfg.optim.lr, weight_decay=cfg.optim.weight_decay, fused=True
    )
    accum = cfg.train.grad_accum_steps
    times, losses, real = [], [], []
    for step in range(args.warmup + args.steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        n_real = 0
        for _ in range(accum):
            batch = loader.next_microbatch()
            with torch.autocast("cuda", torch.bfloat16, enabled=args.qlora):
                loss = micro_loss(model, batch, device, args.liger)
            (loss / accum).backward()
            n_real += real_tokens(batch)
        torch.nn.utils.clip_grad_norm_(params, cfg.optim.grad_clip or float("inf"))
        o = cfg.optim  # zerofit's warm-up and cosine schedule, so both runs take the same steps
        lr = lr_at(step, lr=o.lr, warmup_steps=o.warmup_steps, total_steps=cfg.train.steps,
                   min_lr_ratio=o.min_lr_ratio)  # fmt: skip
        for group in opt.param_groups:
            group["lr"] = lr
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        if step >= args.warmup:
            times.append(time.perf_counter() - t0)
            losses.append(float(loss))
            real.append(n_real)
    step_s = statistics.median(times)
    tokens = cfg.train.micro_batch_size * accum * cfg.model.seq_len * world
    real_tps = statistics.median(n * world / t for n, t in zip(real, times, strict=True))
    fpt = inputs.spec.flops_per_token(cfg.model.seq_len)  # zerofit's one FLOPs function
    peak = peak_flops(device)
    out = {
        "stack": ("transformers+peft+fsdp2" if cfg.model.lora.rank else "transformers+fsdp2")
        + ("+liger" if args.liger else "")
        + ("+compile" if args.compile else ""),
        "liger": args.liger,
        "compile": args.compile,
        "torch": torch.__version__,
        "attn_implementation": args.attn,
        "world_size": world,
        "step_s_median": step_s,
        "step_s": times,
        "tokens_per_step": tokens,
        "real_tokens_per_step": [n * world for n in real],
        "tokens_per_s": tokens / step_s,
        "real_tokens_per_s": real_tps,
        "flops_per_token": fpt,
        "mfu": fpt * tokens / step_s / world / peak if peak else None,
        "mfu_real": fpt * real_tps / world / peak if peak else None,
        "peak_allocated_gib": torch.cuda.max_memory_allocated() / 2**30,
        "losses": losses,
        "trainable_params": sum(p.numel() for p in params),
    }
    if args.qlora:
        out |= {"stack": out["stack"].replace("peft", "peft+bnb4bit"), "qlora": True}
        out |= {
            "load_peak_gib": load_peak,
            "built_gib": built,
            "memory_limit_gib": args.memory_limit_gib,
        }
    if rank == 0:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "results.json").write_text(json.dumps(out, indent=1))
        print(json.dumps({k: v for k, v in out.items() if k not in ("step_s", "losses")}))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
