"""The planner's predictions for the speed runs of 2026-12-02, as JSON, so that the "predicted"
columns of docs/benchmarks/2026-12-02-speed-h200.md come from a file and not from a hand copy.

Each run is the config and overrides that `benchmarks/speed_h200.sh` (or the first 8B call) gave
`zerofit bench`; the planner sees one H200 (141 GB, 125 GiB host RAM) and world size 1.
Usage (CPU is enough; the planner of the commit to record on PYTHONPATH, e.g. HEAD's
`git archive HEAD src | tar -x -C /tmp/head`):
    PYTHONPATH=/tmp/head/src python benchmarks/planner_predictions.py [OUT_JSON]
(default: docs/benchmarks/data/2026-12-02-speed/planner.json).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from zerofit.launch.run_config import load_config
from zerofit.planner.memory import estimate, strategy_for, workload_for
from zerofit.planner.shape import Hardware
from zerofit.planner.speed import predict

try:
    from zerofit.models.shape import shape_from_config
except ImportError:  # before models/shape.py existed
    from zerofit.planner.shape import shape_from_config

ROOT = Path(__file__).resolve().parents[1]

GIB = 2**30
EIGHT_B = "configs/bench/llama3-8b-seq4096.yaml"
ONE_B = "configs/bench/llama3-1b-seq2048.yaml"
Z3 = ["parallel.backend=deepspeed", "parallel.deepspeed.stage=3"]
PURE = ["precision.master_dtype=bf16", "precision.reduce_dtype=bf16"]
MB2 = ["train.micro_batch_size=2", "train.grad_accum_steps=2"]
THIRTEEN_B = [
    "model.preset=13b",
    "model.seq_len=2048",
    "train.micro_batch_size=4",
    "train.grad_accum_steps=2",
    "precision.master_dtype=bf16",
    *Z3,
    "parallel.compile=false",
    "parallel.activation_checkpointing=full",
    "parallel.deepspeed.offload_optimizer=cpu",
    "parallel.deepspeed.offload_ratio=0.5",
]
# name -> (config, overrides); names follow the bench variant of the run they predict
RUNS: dict[str, tuple[str, list[str]]] = {
    "8b fsdp bf16-states mbs1 ga4": (EIGHT_B, ["precision.master_dtype=bf16"]),
    "8b fsdp bf16-states mbs2 ga2": (EIGHT_B, ["precision.master_dtype=bf16", *MB2]),
    "8b fsdp bf16-states bf16-reduce mbs2 ga2": (EIGHT_B, ["parallel.backend=fsdp", *PURE, *MB2]),
    "8b zero3 bf16-states bf16-reduce mbs2 ga2": (EIGHT_B, [*Z3, *PURE, *MB2]),
    "8b fsdp fp32-states AC mbs2 ga2": (
        EIGHT_B,
        ["precision.master_dtype=fp32", "parallel.activation_checkpointing=full", *MB2],
    ),
    "1b fsdp mbs8": (ONE_B, []),
    "1b fsdp mbs8 ga2": (ONE_B, ["train.grad_accum_steps=2"]),
    "1b zero3 mbs8 ga2": (ONE_B, [*Z3, "train.grad_accum_steps=2"]),
    "13b zero3 optim 50% cpu bf16-states": (EIGHT_B, THIRTEEN_B),
}


def predictions() -> dict:
    hw = Hardware(gpus_per_node=1, gpu_mem=141 * 10**9, cpu_mem=125 * GIB)
    out = {}
    for name, (config, overrides) in RUNS.items():
        cfg = load_config(str(ROOT / config), overrides)
        shape, work, strat = shape_from_config(cfg), workload_for(cfg, 1), strategy_for(cfg)
        out[name] = {
            "config": config,
            "overrides": overrides,
            "peak_alloc_gib": estimate(shape, work, strat).peak_allocated / GIB,
            "tokens_per_s": predict(shape, work, strat, hw).tokens_per_s,
        }
    return out


def main(path: Path) -> None:
    commit = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    data = {
        "meta": {"what": "zerofit planner predictions, one H200, world size 1", "commit": commit},
        "runs": predictions(),
    }
    path.write_text(json.dumps(data, indent=1) + "\n")
    for name, r in data["runs"].items():
        print(f"{name:<44} {r['peak_alloc_gib']:7.2f} GiB {r['tokens_per_s']:9,.0f} tokens/s")


if __name__ == "__main__":
    default = ROOT / "docs/benchmarks/data/2026-12-02-speed/planner.json"
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else default)
