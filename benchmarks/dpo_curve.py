"""Issue 28's preference-accuracy curve: DPO on a small base that was pretrained here, on pairs
whose preference generalises, with the held-out pairs' accuracy logged as it trains.

    python benchmarks/dpo_curve.py OUT [--tokenizer DIR] [--base-steps 300] [--dpo-steps 150]
        [--shape tiny] [--rejected words|lines] [--lr 2e-4] [--nproc 1] [--seed 0]

1. A byte-level BPE tokenizer of --vocab entries (2,048: a small table keeps the output layer from
   dominating a small model's step on a CPU) trained on the base's share of this Python's standard
   library, with sft_fixture's specials and chat template; or the one in --tokenizer.
2. The base: a small Llama (--shape: tiny 256 x 4 layers, small 512 x 8) pretrained from random
   weights by `zerofit train` on prompt/completion records (a slice of standard-library source
   and the text that follows it), exported to a Hugging Face folder (checkpoint.export_final).
3. The pairs, from files the base never saw (the corpus is split by file): a prompt (source text),
   `chosen` = the lines that really follow it, `rejected` = the same lines, each with its words
   shuffled. Same words, other order: only what the base learned of code separates them, and a
   preference for well-formed lines carries over to pairs the policy was never trained on.
4. DPO with LoRA (configs/dpo-lora.yaml's settings: r16 all-linear, beta 0.1, the adapters-off
   reference) on the exported base; every --eval-every steps the held-out pairs' DPO loss,
   preference accuracy and reward margin (`eval_loss`, `eval_dpo_accuracy`, `eval_dpo_margin`).

Writes OUT/results.json (the curve: train and held-out accuracy and margin by step, the settings,
versions and machine) and OUT/curve.png. On CPU (2 cores) the default takes a few minutes.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import sft_fixture  # noqa: E402 - the benchmarks folder's own helpers

SHAPES = {  # hidden, layers, heads, kv heads, ffn
    "tiny": dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
                 num_key_value_heads=2, intermediate_size=768),
    "small": dict(hidden_size=512, num_hidden_layers=8, num_attention_heads=8,
                  num_key_value_heads=4, intermediate_size=1536),
}  # fmt: skip


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out")
    p.add_argument("--tokenizer", help="a tokenizer folder to reuse (else one is trained)")
    p.add_argument("--shape", choices=sorted(SHAPES), default="tiny")
    p.add_argument("--vocab", type=int, default=2048, help="the trained tokenizer's entries")
    p.add_argument("--seq", type=int, default=256, help="the base's rows (DPO's: twice that)")
    p.add_argument("--base-steps", type=int, default=300)
    p.add_argument("--dpo-steps", type=int, default=150)
    p.add_argument("--eval-every", type=int, default=10)
    p.add_argument("--lr", default="2e-4", help="DPO's learning rate (LoRA adapters)")
    p.add_argument("--pairs", type=int, default=1200, help="pairs made, --val of them held out")
    p.add_argument("--val", type=int, default=96, help="held-out pairs")
    p.add_argument("--rejected", choices=["words", "lines"], default="words",
                   help="each rejected line's words shuffled, or the lines' order shuffled")  # fmt: skip
    p.add_argument("--nproc", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def split_files(seed: int) -> tuple[list[str], list[str]]:
    """The standard library's source files, shuffled and cut in two: the base's and the pairs'."""
    text = sft_fixture.corpus(8_000_000)
    files = [f for f in text.split("\n\n\n") if len(f) > 2000]
    random.Random(seed).shuffle(files)
    half = len(files) // 2
    return files[:half], files[half:]


def continuation(rng: random.Random, text: str, lines: int = 6) -> tuple[str, list[str]]:
    """A prompt (200-500 characters of `text`, ending at a line end) and the `lines` lines after it."""
    start = rng.randrange(0, max(1, len(text) - 3000))
    cut = text.rfind("\n", start, start + rng.randrange(200, 500)) + 1
    if cut <= start:
        cut = start + 200
    after = [ln for ln in text[cut : cut + 2000].split("\n") if ln.strip()][:lines]
    return text[start:cut], after


def base_records(files: list[str], n: int, rng: random.Random) -> list[dict]:
    out = []
    while len(out) < n:
        prompt, after = continuation(rng, rng.choice(files))
        out.append({"prompt": prompt, "completion": "\n".join(after) + "\n"})
    return out


def scramble(line: str, rng: random.Random) -> str:
    """The line's words (split at spaces) in a shuffled order, its indentation kept."""
    body = line.lstrip(" ")
    words = body.split(" ")
    rng.shuffle(words)
    return line[: len(line) - len(body)] + " ".join(words)


def pair_records(files: list[str], n: int, rng: random.Random, rejected: str) -> list[dict]:
    """Pairs whose rejected response is the chosen one with each line's words shuffled
    (`rejected` "words"), or with its lines in a shuffled order ("lines": a harder preference)."""
    out = []
    while len(out) < n:
        prompt, after = continuation(rng, rng.choice(files))
        if rejected == "words":
            shuffled = [scramble(line, rng) for line in after]
        else:
            shuffled = rng.sample(after, len(after))
        if len(after) < 4 or shuffled == after:
            continue
        out.append(
            {
                "prompt": prompt,
                "chosen": "\n".join(after) + "\n",
                "rejected": "\n".join(shuffled) + "\n",
            }
        )
    return out


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def zerofit(out: Path, name: str, args: list[str], nproc: int) -> Path:
    """`zerofit train` with `args`, its output in OUT/name.log; the run folder."""
    run = out / name
    cmd = [sys.executable, "-m", "zerofit.cli", "train", "--nproc", str(nproc)]
    cmd += [*args, "--log.run_dir", str(run), "--log.progress", "false"]
    with open(out / f"{name}.log", "w") as log:
        code = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT).returncode
    if code != 0:
        tail = (out / f"{name}.log").read_text().splitlines()[-15:]
        raise SystemExit(f"{name} failed ({code}):\n" + "\n".join(tail))
    return run


def make_base(a: argparse.Namespace, out: Path, tok, files: list[str]) -> Path:  # noqa: ANN001
    folder = out / "base-config"
    tok.save_pretrained(folder)
    cfg = sft_fixture.model_config("1b", tok.bos_token_id, tok.eos_token_id)
    for k, v in {**SHAPES[a.shape], "vocab_size": len(tok), "tie_word_embeddings": True}.items():
        setattr(cfg, k, v)
    cfg.save_pretrained(folder)
    data = write_jsonl(out / "base.jsonl", base_records(files, 6000, random.Random(a.seed)))
    run = zerofit(out, "base", [
        "--model.hf", str(folder), "--model.random_init", "true", "--model.seq_len", str(a.seq),
        "--data.source", str(data), "--data.format", "prompt_completion", "--data.val_fraction", "0", "--train.epochs", "null",
        "--train.steps", str(a.base_steps), "--train.micro_batch_size", "8",
        "--train.grad_accum_steps", "1", "--train.eval_every", "0", "--optim.lr", "2e-3",
        "--optim.warmup_steps", "20", "--precision.mode", "fp32", "--checkpoint.every", "0",
        "--checkpoint.export_final", "true", "--log.every", "50", "--train.seed", str(a.seed),
    ], a.nproc)  # fmt: skip
    exported = sorted((run / "export").iterdir())
    return exported[-1]


def read_metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def plot(curve: list[dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    train = [r for r in curve if "dpo_accuracy" in r]
    held = [r for r in curve if "eval_dpo_accuracy" in r]
    ax.plot([r["step"] for r in train], [r["dpo_accuracy"] for r in train], label="train pairs")
    ax.plot(
        [r["step"] for r in held],
        [r["eval_dpo_accuracy"] for r in held],
        "o-",
        label="held-out pairs",
    )
    ax2 = ax.twinx()
    ax2.plot(
        [r["step"] for r in held], [r["eval_loss"] for r in held], "s--", color="tab:green",
        label="held-out DPO loss",
    )  # fmt: skip
    ax2.set_ylabel("DPO loss (ln 2 = 0.693 at step 0)")
    ax2.set_ylim(0, 0.75)
    ax.set_xlabel("DPO step")
    ax.set_ylabel("preference accuracy")
    ax.set_ylim(0, 1.02)
    ax.grid(alpha=0.3)
    lines = ax.get_legend_handles_labels()
    more = ax2.get_legend_handles_labels()
    ax.legend(lines[0] + more[0], lines[1] + more[1], loc="center right")
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    a = parse(argv)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    base_files, pair_files = split_files(a.seed)
    if a.tokenizer:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(a.tokenizer)
    else:
        # a small table keeps the output layer from dominating a small model's step on a CPU
        tok = sft_fixture.tokenizer("\n".join(base_files)[:4_000_000], out / "tokenizer", a.vocab)
    base = make_base(a, out, tok, base_files)
    rng = random.Random(a.seed + 1)
    pairs = write_jsonl(out / "pairs.jsonl", pair_records(pair_files, a.pairs, rng, a.rejected))
    val_fraction = a.val / a.pairs
    dpo = zerofit(out, "dpo", [
        "-c", str(HERE.parent / "configs" / "dpo-lora.yaml"), "--model.hf", str(base),
        "--model.seq_len", str(2 * a.seq), "--data.source", str(pairs),
        "--data.val_fraction", f"{val_fraction:.6f}", "--train.epochs", "null",
        "--train.steps", str(a.dpo_steps), "--train.micro_batch_size", "4",
        "--train.grad_accum_steps", "1", "--train.eval_every", str(a.eval_every),
        "--train.eval_batches", "64", "--optim.lr", a.lr, "--optim.warmup_steps", "10",
        "--precision.mode", "fp32", "--parallel.backend", "fsdp", "--checkpoint.every", "0",
        "--checkpoint.save_final", "false", "--checkpoint.export_final", "false",
        "--log.every", "5", "--train.seed", str(a.seed),
    ], a.nproc)  # fmt: skip
    curve = read_metrics(dpo)
    keys = ("step", "loss", "dpo_accuracy", "dpo_margin", "eval_loss", "eval_dpo_accuracy")
    keys += ("eval_dpo_margin",)
    curve = [{k: r[k] for k in keys if k in r} for r in curve]
    import torch
    import transformers

    held = [r for r in curve if "eval_dpo_accuracy" in r]
    result = {
        "what": "DPO preference accuracy on a base pretrained here (issue 28)",
        "command": "python benchmarks/dpo_curve.py "
        + " ".join(sys.argv[1:] if argv is None else argv),
        "shape": {**SHAPES[a.shape], "vocab_size": len(tok)},
        "base_steps": a.base_steps,
        "dpo_steps": a.dpo_steps,
        "pairs": a.pairs,
        "rejected": a.rejected,
        "held_out_pairs": a.val,
        "nproc": a.nproc,
        "seed": a.seed,
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
        "machine": platform.processor() or platform.machine(),
        "wall_s": round(time.time() - t0, 1),
        "held_out_first": held[0] if held else None,
        "held_out_last": held[-1] if held else None,
        "curve": curve,
    }
    (out / "results.json").write_text(json.dumps(result, indent=1))
    how = "words shuffled in each line" if a.rejected == "words" else "lines shuffled"
    title = f"DPO (LoRA r16), {a.shape} base pretrained {a.base_steps} steps; rejected: {how}"
    plot(curve, out / "curve.png", title)
    if held:
        print(
            f"held-out accuracy {held[0]['eval_dpo_accuracy']:.3f} at step {held[0]['step']} -> "
            f"{held[-1]['eval_dpo_accuracy']:.3f} at step {held[-1]['step']} ({result['wall_s']} s)"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
