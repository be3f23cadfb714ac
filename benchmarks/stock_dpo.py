"""The stock DPO stack on the same preference pairs as zerofit: TRL's DPOTrainer (+ PEFT).

    python benchmarks/stock_dpo.py --model FIXTURE/model-8b --pairs FIXTURE/pairs.jsonl --out DIR \
        [--lora 16] [--micro 4] [--accum 2] [--seq 2048] [--liger] [--padding-free] [--gc]
        [--warmup 3] [--steps 10] [--cpu]

"The usual way", as a TRL user runs it on one GPU:
- `AutoModelForCausalLM.from_config` of the fixture's folder (random weights, as zerofit's
  `model.random_init`), attention "sdpa" (or FlashAttention varlen with `--padding-free`, TRL's
  padding-free collation, which needs it); bf16 weights with LoRA (the frozen base in bf16,
  PEFT's adapters in fp32), fp32 weights for a full DPO, `bf16=True` autocast either way;
- `--lora R`: PEFT LoRA on every linear layer (`target_modules="all-linear"`, alpha 2R, no
  dropout, as configs/dpo-lora.yaml); TRL's reference is then the base with the adapters off, as
  zerofit's. Without it, the reference is a second, frozen copy of the model (what TRL builds
  from the model's name; one built from a config has none, so the copy is passed here);
- `DPOConfig`: sigmoid loss, beta 0.1, `max_length` = --seq (pairs longer are cut from the end,
  TRL's default), AdamW (torch fused), the learning rate of configs/dpo-lora.yaml, no eval;
  `--liger`: `use_liger_kernel` (Liger's fused kernels and its fused linear DPO loss);
  `--gc`: gradient checkpointing per decoder layer;
- each step is timed between synchronized callbacks (`on_step_begin` / `on_step_end`); the
  median over the steps after `--warmup`.

Real tokens per second count both documents of every pair (prompt + chosen, prompt + rejected,
as TRL tokenises and cuts them) over the pairs a step consumes: the mean over the dataset times
the pairs per step, divided by the median step time. zerofit counts the same places.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import time
from pathlib import Path

import torch
from transformers import TrainerCallback


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True)
    p.add_argument("--pairs", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--lora", type=int, default=0, help="LoRA rank (0: full DPO)")
    p.add_argument("--micro", type=int, default=4)
    p.add_argument("--accum", type=int, default=2)
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--lr", type=float, default=5e-5)
    p.add_argument("--liger", action="store_true")
    p.add_argument("--padding-free", action="store_true")
    p.add_argument("--gc", action="store_true", help="gradient checkpointing")
    p.add_argument("--cpu", action="store_true", help="a CPU smoke run (fp32, no bf16)")
    return p.parse_args()


def build_model(a: argparse.Namespace):  # noqa: ANN201 - a transformers model
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(a.model)
    attn = "flash_attention_2" if a.padding_free else "sdpa"
    dtype = torch.bfloat16 if a.lora and not a.cpu else torch.float32
    torch.manual_seed(0)
    with torch.device("cpu" if a.cpu else "cuda"):  # an 8B initialised on the host takes minutes
        return AutoModelForCausalLM.from_config(config, attn_implementation=attn, dtype=dtype)


class StepTimes(TrainerCallback):
    """Times each optimizer step between synchronized points."""

    def __init__(self, cuda: bool) -> None:
        self.cuda, self.times, self.start = cuda, [], 0.0

    def _sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def on_step_begin(self, *args, **kwargs) -> None:  # noqa: ANN002, ANN003
        self._sync()
        self.start = time.perf_counter()

    def on_step_end(self, *args, **kwargs) -> None:  # noqa: ANN002, ANN003
        self._sync()
        self.times.append(time.perf_counter() - self.start)


def tokens_per_pair(trainer, max_length: int) -> float:  # noqa: ANN001 - a trl DPOTrainer
    """The mean places a pair takes, both documents (prompt + response, cut at `max_length`), as
    TRL tokenised them (``prompt_ids`` and ``<side>_ids``, the response alone)."""
    data = trainer.train_dataset
    total = 0
    for row in data:
        prompt = len(row["prompt_ids"])
        for side in ("chosen", "rejected"):
            total += min(prompt + len(row[f"{side}_ids"]), max_length)
    return total / max(len(data), 1)


def tolerate_unhashable_tables() -> None:
    """datasets fingerprints a new Dataset by pickling it with dill; with pyarrow 26 on Python
    3.12.1 that raises (pyarrow's MonthDayNano type is "not found as builtins.MonthDayNano"), where
    datasets already falls back to a random fingerprint for an unhashable map function. The same
    fallback here: a fingerprint only names cache files, and no cache is read in this benchmark."""
    import datasets.arrow_dataset as arrow_dataset
    from datasets.fingerprint import generate_random_fingerprint

    hashed = arrow_dataset.generate_fingerprint

    def fingerprint(dataset: object) -> str:
        try:
            return hashed(dataset)
        except Exception:  # any pickling failure: a random name, as datasets does for maps
            return generate_random_fingerprint()

    arrow_dataset.generate_fingerprint = fingerprint


def main() -> int:
    a = parse()
    tolerate_unhashable_tables()
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import DPOConfig, DPOTrainer

    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    records = [json.loads(line) for line in Path(a.pairs).read_text().splitlines() if line.strip()]
    tok = AutoTokenizer.from_pretrained(a.model)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    peft_config = None
    if a.lora:
        from peft import LoraConfig

        peft_config = LoraConfig(r=a.lora, lora_alpha=2 * a.lora, lora_dropout=0.0,
                                 target_modules="all-linear", task_type="CAUSAL_LM")  # fmt: skip
    args = DPOConfig(
        output_dir=str(out / "trl"), per_device_train_batch_size=a.micro,
        gradient_accumulation_steps=a.accum, max_steps=a.warmup + a.steps, learning_rate=a.lr,
        lr_scheduler_type="constant", beta=0.1, loss_type="sigmoid", max_length=a.seq,
        bf16=not a.cpu, use_cpu=a.cpu, gradient_checkpointing=a.gc, use_liger_kernel=a.liger,
        padding_free=a.padding_free, logging_steps=1, report_to="none", save_strategy="no",
        dataloader_num_workers=0, dataset_num_proc=1, optim="adamw_torch" if a.cpu else "adamw_torch_fused",
        seed=0,
    )  # fmt: skip
    timer = StepTimes(cuda=not a.cpu)
    model = build_model(a)
    # a full DPO's reference: a frozen copy, which TRL would load from the model's name (a model
    # built from a config has none)
    reference = None if a.lora else copy.deepcopy(model).eval().requires_grad_(False)
    trainer = DPOTrainer(model=model, ref_model=reference, args=args,
                         train_dataset=Dataset.from_list(records), processing_class=tok,
                         peft_config=peft_config, callbacks=[timer])  # fmt: skip
    if not a.cpu:
        torch.cuda.reset_peak_memory_stats()
    trainer.train()
    timed = timer.times[a.warmup :]
    step = statistics.median(timed)
    per_pair = tokens_per_pair(trainer, a.seq)
    pairs = a.micro * a.accum
    result = {
        "stack": "trl-dpo" + ("+peft" if a.lora else "") + ("+liger" if a.liger else "")
        + ("+padding_free" if a.padding_free else "") + ("+gc" if a.gc else ""),
        "trl": __import__("trl").__version__, "torch": torch.__version__,
        "lora_rank": a.lora, "micro": a.micro, "accum": a.accum, "seq": a.seq,
        "step_times": timer.times, "step_s_median": step, "pairs_per_step": pairs,
        "tokens_per_pair": per_pair, "real_tokens_per_s": per_pair * pairs / step,
        "pairs_per_s": pairs / step,
        "peak_allocated_gib": 0.0 if a.cpu else torch.cuda.max_memory_allocated() / 2**30,
        "losses": [h["loss"] for h in trainer.state.log_history if "loss" in h],
    }  # fmt: skip
    (out / "results.json").write_text(json.dumps(result, indent=1))
    print(json.dumps({k: v for k, v in result.items() if k not in ("step_times", "losses")}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
