"""Planner calibration: predicted vs measured peak allocated GPU memory, side by side.

Runs each configuration for 4 steps through `zerofit train` (its own processes), reads the measured
peak allocated memory from the run's summary, and compares it with the planner's prediction for the
resolved config. Usage (GPU machine): python3 benchmarks/calibrate.py OUT_DIR [NAME ...]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from zerofit.launch import child_run as runner
from zerofit.launch.run_config import load_config
from zerofit.planner.memory import predicted_peak

ONE_B = ["--model.preset", "llama3-1b", "--precision.mode", "bf16"]
EIGHT_B = ["--model.preset", "llama3-8b", "--precision.mode", "bf16"]
CONFIGS = {
    "1b_fsdp_mbs4": [*ONE_B, "--train.micro_batch_size", "4"],
    "1b_fsdp_mbs8_ac": [
        *ONE_B,
        "--train.micro_batch_size",
        "8",
        "--parallel.activation_checkpointing",
        "full",
    ],
    "1b_ddp_mbs4": [*ONE_B, "--train.micro_batch_size", "4", "--parallel.backend", "ddp"],
    "1b_zero3_mbs4": [*ONE_B, "--train.micro_batch_size", "4", "--parallel.backend", "deepspeed"],
    "1b_zero3_seq4096_ac": [
        *ONE_B,
        "--model.seq_len",
        "4096",
        "--train.micro_batch_size",
        "2",
        "--parallel.backend",
        "deepspeed",
        "--parallel.activation_checkpointing",
        "full",
    ],
    "1b_zero3_mbs2": [*ONE_B, "--train.micro_batch_size", "2", "--parallel.backend", "deepspeed"],
    "1b_ddp_mbs8_ac": [
        *ONE_B,
        "--train.micro_batch_size",
        "8",
        "--parallel.backend",
        "ddp",
        "--parallel.activation_checkpointing",
        "full",
    ],
    "1b_fsdp_seq8192_mbs1": [*ONE_B, "--model.seq_len", "8192", "--train.micro_batch_size", "1"],
    "4b_fsdp_mbs2_ac": [
        *EIGHT_B,
        "--model.overrides",
        "{n_layers: 12}",
        "--train.micro_batch_size",
        "2",
        "--parallel.activation_checkpointing",
        "full",
    ],
    "8b_fsdp_mbs2_ac": [
        *EIGHT_B,
        "--train.micro_batch_size",
        "2",
        "--parallel.activation_checkpointing",
        "full",
    ],
}
COMMON = [
    "--model.seq_len",
    "2048",
    "--train.steps",
    "4",
    "--train.eval_every",
    "0",
    "--log.every",
    "1",
    "--log.progress",
    "false",
    "--checkpoint.save_final",
    "false",
    "--data.max_tokens",
    "3000000",
]


def pairs(flags: list[str]) -> list[tuple[str, str]]:
    """['--a.b', 'v', ...] -> [('--a.b', 'v'), ...]"""
    return list(zip(flags[::2], flags[1::2], strict=True))


def main(out: Path, names: list[str]) -> None:
    rows = []
    for name in names or list(CONFIGS):
        run = out / name
        got = runner.train(
            run,
            [a[2:] + "=" + b for a, b in pairs([*COMMON, *CONFIGS[name]])],
            out / f"{name}.log",
            timeout=240,
        )
        measured = (got.summary or {}).get("mem_alloc_gib")
        cfg = load_config(run / "config.yaml")
        predicted, parts = predicted_peak(cfg, 1)
        row = {
            "config": name,
            "predicted_gib": predicted,
            "measured_gib": measured,
            "components_gib": parts,
        }
        if measured:
            row["error"] = predicted / measured - 1
        else:
            errors = [ln for ln in got.log().splitlines() if "Error" in ln or "error" in ln]
            row["failure"] = (errors or ["?"])[-3:]
        rows.append(row)
        err = f"{100 * row['error']:+.1f}%" if measured else " | ".join(row["failure"])[:400]
        print(
            f"{name:<24} predicted {predicted:7.2f} GiB  measured {measured or 0:7.2f} GiB  {err}",
            flush=True,
        )
    (out / "calibration.json").write_text(json.dumps(rows, indent=1))
    ok = [r for r in rows if r.get("measured_gib")]
    within = sum(abs(r["error"]) <= 0.10 for r in ok)
    print(f"{within}/{len(ok)} within 10% (of {len(rows)} configurations)")


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2:])
