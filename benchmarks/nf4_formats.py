"""zerofit's NF4 pieces beside torchao's NF4Tensor and bitsandbytes' 4-bit storage, per weight.

    python benchmarks/nf4_formats.py OUT.json [--shape 8b]

For the linear layers of one Llama-3-8B (or 70B) decoder block, random N(0, 0.02) bf16 weights:
- bytes held per weight by each format (every tensor a weight needs to be rebuilt);
- the rebuild's error against the bf16 weight (mean absolute, relative to the mean |w|): the three
  should agree, being the same 16 levels over blocks of 64;
- on a GPU, the time to rebuild all of the block's weights in bf16 (median of 20, CUDA-synchronised):
  zerofit's `dequantize` (its torch ops) eager and under `torch.compile`, zerofit's Triton kernel
  (`zerofit.models.nf4_kernel`, where Triton is installed), torchao's `get_original_weight`,
  bitsandbytes' `dequantize_4bit` (its CUDA kernel);
- on a GPU with Triton, the kernel's time at each scale-block count and warp count a program
  (`kernel_sweep`, best first): what nf4_kernel's ROWS_PER_PROGRAM and WARPS are set from.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

SHAPES = {  # one decoder block's linears: q, k, v, o, gate, up, down ([out, in])
    "8b": [(4096, 4096), (1024, 4096), (1024, 4096), (4096, 4096)]
    + [(14336, 4096), (14336, 4096), (4096, 14336)],
    "70b": [(8192, 8192), (1024, 8192), (1024, 8192), (8192, 8192)]
    + [(28672, 8192), (28672, 8192), (8192, 28672)],
}


def nbytes(*tensors: torch.Tensor) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def timed(fn, repeats: int = 20) -> float:  # noqa: ANN001
    """Median seconds of `fn()` (synchronised on CUDA)."""
    cuda = torch.cuda.is_available()
    times = []
    for _ in range(repeats + 3):
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times[3:])


def formats(weights: list[torch.Tensor]) -> dict[str, dict]:
    """Each format's bytes, error and (on a GPU) rebuild time over `weights`."""
    from torchao.quantization import to_nf4

    from zerofit.models import nf4
    from zerofit.models.nf4 import dequantize, quantize

    nf4.USE_KERNEL = False  # the torch ops' rows; the kernel has its own
    ours = [quantize(w) for w in weights]
    builds = {
        "zerofit pieces": (
            sum(nbytes(*p.values()) for p in ours),
            lambda: [
                dequantize(p, w.shape, torch.bfloat16) for p, w in zip(ours, weights, strict=True)
            ],
        )
    }
    compiled = torch.compile(dequantize)
    builds["zerofit pieces, compiled"] = (
        builds["zerofit pieces"][0],
        lambda: [compiled(p, w.shape, torch.bfloat16) for p, w in zip(ours, weights, strict=True)],
    )
    kernel = nf4.rebuild_bf16
    if kernel is not None and torch.cuda.is_available():
        builds["zerofit pieces, Triton kernel"] = (
            builds["zerofit pieces"][0],
            lambda: [
                kernel(*(p[n] for n in nf4.PIECES), nf4.LEVELS, False).view(w.shape)
                for p, w in zip(ours, weights, strict=True)
            ],
        )
    ao = [to_nf4(w, 64, 256) for w in weights]
    ao_bytes = sum(
        nbytes(t.quantized_data, t.quantized_scalers, t.quantization_factor, t.scaler_mean, t.nf4)
        for t in ao
    )
    builds["torchao NF4Tensor"] = (ao_bytes, lambda: [t.get_original_weight() for t in ao])
    try:
        import bitsandbytes.functional as bnbf
    except ImportError:
        bnbf = None
    if bnbf is not None and torch.cuda.is_available():
        bnb = [bnbf.quantize_4bit(w, compress_statistics=True, quant_type="nf4") for w in weights]
        bnb_bytes = sum(
            nbytes(q, s.absmax, s.code, s.state2.absmax, s.state2.code, s.offset) for q, s in bnb
        )
        builds["bitsandbytes Params4bit (nested)"] = (
            bnb_bytes,
            lambda: [bnbf.dequantize_4bit(q, s, quant_type="nf4") for q, s in bnb],
        )
    total = sum(w.numel() for w in weights)
    scale = statistics.fmean(float(w.float().abs().mean()) for w in weights)
    out = {}
    torch_ops = builds["zerofit pieces"][1]()
    for name, (size, build) in builds.items():
        rebuilt = build()
        same = all(torch.equal(r, t) for r, t in zip(rebuilt, torch_ops, strict=True))
        err = statistics.fmean(
            float((r.float() - w.float()).abs().mean())
            for r, w in zip(rebuilt, weights, strict=True)
        )
        out[name] = {
            "bytes": size,
            "bytes_per_weight": size / total,
            "mean_abs_error_rel": err / scale,
            "rebuild_ms": timed(build) * 1e3 if torch.cuda.is_available() else None,
            "same_bits_as_torch_ops": same,
        }
    return out


def kernel_sweep(weights: list[torch.Tensor]) -> list[dict]:
    """The Triton kernel's rebuild time over `weights` at each program size, fastest first."""
    from zerofit.models import nf4, nf4_kernel

    pieces = [nf4.quantize(w) for w in weights]
    want = [
        nf4.dequantize(p, w.shape, torch.bfloat16) for p, w in zip(pieces, weights, strict=True)
    ]
    rows = []
    for per_program in (16, 32, 64, 128, 256):
        for warps in (1, 2, 4, 8):

            def build(r: int = per_program, n: int = warps) -> list[torch.Tensor]:
                words = ([p[k] for k in nf4.PIECES] for p in pieces)
                return [nf4_kernel.launch(*w, nf4.LEVELS, r, n) for w in words]

            got = build()
            same = all(torch.equal(g.view(w.shape), w) for g, w in zip(got, want, strict=True))
            ms = timed(build) * 1e3
            rows.append({"rows": per_program, "warps": warps, "rebuild_ms": ms, "same": same})
    return sorted(rows, key=lambda r: r["rebuild_ms"])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out")
    p.add_argument("--shape", default="8b", choices=sorted(SHAPES))
    a = p.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    gen = torch.Generator(device=device).manual_seed(0)
    weights = [
        (torch.randn(s, generator=gen, device=device) * 0.02).to(torch.bfloat16)
        for s in SHAPES[a.shape]
    ]
    res = {
        "shape": a.shape,
        "weights": sum(w.numel() for w in weights),
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "torch": torch.__version__,
        "formats": formats(weights),
    }
    if device == "cuda" and "zerofit pieces, Triton kernel" in res["formats"]:
        res["kernel_sweep"] = kernel_sweep(weights)
    Path(a.out).write_text(json.dumps(res, indent=1))
    for name, r in res["formats"].items():
        ms = f"{r['rebuild_ms']:.3f} ms" if r["rebuild_ms"] is not None else "-"
        print(
            f"{name:36s} {r['bytes_per_weight']:.4f} B/w  err {r['mean_abs_error_rel']:.4f}  {ms}"
        )
    for r in res.get("kernel_sweep", [])[:5]:
        print(f"kernel rows {r['rows']:4d} warps {r['warps']}: {r['rebuild_ms']:.3f} ms")


if __name__ == "__main__":
    main()
