"""Peak host memory of a QLoRA run whose base is read from real safetensors, on CPU: the bf16
weights are quantised layer by layer as they are read, so the process should need about the
quantised model plus one weight, not the bf16 checkpoint.

    python benchmarks/qlora_host_rss.py FIXTURE OUT.json [--shape 1b]

FIXTURE is what `python benchmarks/sft_fixture.py FIXTURE` made. The script writes a model folder
of that shape with random bf16 weights in safetensors (next to OUT.json, removed afterwards), then
runs one `zerofit train` step (seq 256, one row) for each way below, sampling the resident memory
of its processes every 0.1 s: the largest process's peak anonymous RSS while the model is built
and over the whole run, and its peak file-backed RSS (the safetensors' pages mapped in).
- QLoRA (configs/finetune-qlora.yaml: NF4 base), one process and two (each layer read by one
  rank and broadcast in 4 bits);
- bf16 LoRA (the same with ``model.lora.quantize: none``), one process.
On CPU the model lives in host memory, so the build's peak is the model itself plus what loading
holds on the way; the step then adds CPU training's own buffers.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GIB = 2**30
READY = "weights: "  # the first line a run prints once its model is built (Trainer)


def write_model(fixture: Path, shape: str, folder: Path) -> int:
    """A `shape` Llama with random bf16 weights in `folder` (tokenizer from the fixture); returns
    the bytes of its safetensors."""
    import torch  # heavy: only the parent writes the model
    from transformers import AutoConfig, LlamaForCausalLM

    src = fixture / f"model-{shape}"
    shutil.copytree(src, folder)
    cfg = AutoConfig.from_pretrained(folder)
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    model.save_pretrained(folder, max_shard_size="1GB")
    del model
    return sum(p.stat().st_size for p in folder.glob("*.safetensors"))


def _tree(pid: int) -> list[int]:
    """`pid` and its descendants."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            children = Path(f"/proc/{p}/task/{p}/children").read_text().split()
        except OSError:
            continue
        todo += [int(c) for c in children]
    return out


def _rss(pid: int) -> tuple[int, int]:
    """(anonymous, file-backed) resident KiB of a process; (0, 0) once it is gone."""
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError:
        return 0, 0
    kib = {ln.split(":")[0]: int(ln.split()[1]) for ln in lines if ln.startswith("Rss")}
    return kib.get("RssAnon", 0), kib.get("RssFile", 0)


def sampled(cmd: list[str], ready: str) -> dict[str, float]:
    """Run `cmd`, sampling every process's resident memory every 0.1 s: the largest process's
    peak anonymous RSS while the model loads (until a line of its output starts with `ready`) and
    over the whole run, and its peak file-backed RSS (the safetensors' pages mapped in: the
    kernel's page cache, dropped under pressure), in GiB."""
    start = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    peaks = {"load": 0, "train": 0, "run": 0, "file": 0}
    phase = ["load"]
    tail: list[str] = []

    def sample() -> None:
        while proc.poll() is None:
            for pid in _tree(proc.pid):
                anon, file = _rss(pid)
                for key in {phase[0], "run"}:
                    peaks[key] = max(peaks[key], anon)
                peaks["file"] = max(peaks["file"], file)
            time.sleep(0.1)

    watcher = threading.Thread(target=sample, daemon=True)
    watcher.start()
    assert proc.stdout is not None
    for line in proc.stdout:
        tail = (tail + [line])[-40:]
        if line.startswith(ready):
            phase[0] = "train"
    proc.wait()
    watcher.join()
    if proc.returncode != 0:
        raise SystemExit(f"{cmd[:6]} failed:\n{''.join(tail)}")
    out = {f"peak_anon_{k}_gib": round(peaks[k] * 1024 / GIB, 3) for k in ("load", "run")}
    out["peak_file_gib"] = round(peaks["file"] * 1024 / GIB, 3)
    out["wall_s"] = round(time.monotonic() - start, 1)
    return out


def train(folder: Path, fixture: Path, run: Path, *extra: str) -> list[str]:
    flags = {
        "model.hf": folder,
        "data.source": fixture / "chat.jsonl",
        "model.seq_len": 256,
        "train.steps": 1,
        "train.micro_batch_size": 1,
        "train.grad_accum_steps": 1,
        "train.eval_every": 0,
        "data.val_fraction": 0,
        "checkpoint.every": 0,
        "checkpoint.save_final": "false",
        "checkpoint.export_final": "false",
        "log.run_dir": run,
    }
    cmd = [
        sys.executable,
        "-m",
        "zerofit.cli",
        "train",
        "-c",
        str(ROOT / "configs/finetune-qlora.yaml"),
    ]
    for key, value in flags.items():
        cmd += [f"--{key}", str(value)]
    return cmd + list(extra)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("fixture", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--shape", default="1b")
    args = ap.parse_args()
    work = args.out.parent / f"host-rss-{args.shape}"
    shutil.rmtree(work, ignore_errors=True)
    folder = work / "model"
    try:
        on_disk = write_model(args.fixture.resolve(), args.shape, folder)
        fixture = args.fixture.resolve()
        ways = {
            "QLoRA (NF4 base), 1 process": train(folder, fixture, work / "q1", "--nproc", "1"),
            "QLoRA (NF4 base), 2 processes": train(folder, fixture, work / "q2", "--nproc", "2"),
            "bf16 LoRA, 1 process": train(
                folder, fixture, work / "b1", "--nproc", "1", "--model.lora.quantize", "none"
            ),
        }
        rows = {}
        for name, cmd in ways.items():
            rows[name] = sampled(cmd, READY)
            print(name, rows[name], flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    import torch
    import transformers

    meta = {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "shape": args.shape,
        "safetensors_gib": round(on_disk / GIB, 3),
        "command": " ".join(["python", "benchmarks/qlora_host_rss.py", *sys.argv[1:]]),
    }
    args.out.write_text(json.dumps({"meta": meta, "ways": rows}, indent=1))


if __name__ == "__main__":
    main()
