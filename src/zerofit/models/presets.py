"""The built-in Llama shapes (`model.preset`) and their arguments: plain data, no torch."""

from __future__ import annotations

import difflib
import math
from dataclasses import dataclass, fields, replace

from zerofit.config.limits import shown
from zerofit.errors import UserError

# Upper bounds of the integer fields: far above any real model, low enough that a typo cannot
# ask for a model whose structure alone takes minutes to build (n_layers) or overflows int64.
_SIZE_LIMITS = {
    "dim": 2**20,
    "n_layers": 1024,
    "n_heads": 2**14,
    "n_kv_heads": 2**14,
    "vocab_size": 2**24,
    "ffn_dim": 2**22,
    "max_seq_len": 2**24,
}


@dataclass(frozen=True)
class LlamaArgs:
    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    vocab_size: int
    ffn_dim: int
    max_seq_len: int
    norm_eps: float = 1e-5
    rope_theta: float = 500000.0

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    def validate(self) -> None:
        """Raise ValueError for shapes that cannot build a model (or only an absurd one)."""
        for name, high in _SIZE_LIMITS.items():
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"{name} must be an integer, got {shown(value)}")
            if value <= 0:
                raise ValueError(f"{name} must be positive, got {shown(value)}")
            if value > high:
                raise ValueError(f"{name} must be at most {high}, got {shown(value)}")
        for name in ("norm_eps", "rope_theta"):
            value = getattr(self, name)
            number = isinstance(value, int | float) and not isinstance(value, bool)
            if not (number and math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a finite number > 0, got {shown(value)}")
        if self.dim % self.n_heads:
            raise ValueError(f"dim {self.dim} is not divisible by n_heads {self.n_heads}")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(
                f"n_heads {self.n_heads} is not divisible by n_kv_heads {self.n_kv_heads}"
            )
        if self.head_dim % 2:
            raise ValueError(f"head_dim {self.head_dim} must be even for RoPE")


PRESETS: dict[str, LlamaArgs] = {
    # ~3.4M parameters, made for CPU tests.
    "tiny": LlamaArgs(dim=256, n_layers=4, n_heads=4, n_kv_heads=2, vocab_size=512, ffn_dim=768, max_seq_len=1024),
    # ~25.7M parameters, a quick single-GPU smoke run.
    "small": LlamaArgs(dim=512, n_layers=8, n_heads=8, n_kv_heads=4, vocab_size=512, ffn_dim=1536, max_seq_len=2048),
    # Llama-3.2-1B shape, but with an untied output layer.
    "llama3-1b": LlamaArgs(dim=2048, n_layers=16, n_heads=32, n_kv_heads=8, vocab_size=128256, ffn_dim=8192, max_seq_len=131072),
    "llama3-8b": LlamaArgs(dim=4096, n_layers=32, n_heads=32, n_kv_heads=8, vocab_size=128256, ffn_dim=14336, max_seq_len=131072),
    # Llama-2-13B shape (multi-head attention, 32k vocabulary).
    "13b": LlamaArgs(dim=5120, n_layers=40, n_heads=40, n_kv_heads=40, vocab_size=32000, ffn_dim=13824, max_seq_len=4096, rope_theta=10000.0),
    # Llama-3-70B shape.
    "70b": LlamaArgs(dim=8192, n_layers=80, n_heads=64, n_kv_heads=8, vocab_size=128256, ffn_dim=28672, max_seq_len=131072),
}  # fmt: skip


def param_shapes(args: LlamaArgs) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every parameter of ``Llama(args)``, in ``named_parameters()`` order."""
    d, hd, f = args.dim, args.head_dim, args.ffn_dim
    shapes: dict[str, tuple[int, ...]] = {"tok_embeddings.weight": (args.vocab_size, d)}
    for i in range(args.n_layers):
        p = f"layers.{i}."
        shapes[p + "attention_norm.weight"] = (d,)
        shapes[p + "attention.wq.weight"] = (args.n_heads * hd, d)
        shapes[p + "attention.wk.weight"] = (args.n_kv_heads * hd, d)
        shapes[p + "attention.wv.weight"] = (args.n_kv_heads * hd, d)
        shapes[p + "attention.wo.weight"] = (d, args.n_heads * hd)
        shapes[p + "ffn_norm.weight"] = (d,)
        shapes[p + "feed_forward.w1.weight"] = (f, d)
        shapes[p + "feed_forward.w2.weight"] = (d, f)
        shapes[p + "feed_forward.w3.weight"] = (f, d)
    shapes["norm.weight"] = (d,)
    shapes["output.weight"] = (args.vocab_size, d)
    return shapes


def preset_args(preset: str, overrides: dict | None = None) -> LlamaArgs:
    """A preset's LlamaArgs with `model.overrides` applied and checked (one UserError line)."""
    if preset not in PRESETS:
        close = difflib.get_close_matches(preset, PRESETS, n=1, cutoff=0.0)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise UserError(
            f"unknown model preset {shown(preset)}{hint} (choices: {', '.join(PRESETS)})"
        )
    args = PRESETS[preset]
    if not overrides:
        return args
    valid = {f.name for f in fields(LlamaArgs)}
    for key in overrides:
        if key not in valid:
            close = difflib.get_close_matches(key, valid, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise UserError(f"unknown model override {shown(key)}{hint}")
    try:
        args = replace(args, **overrides)
        args.validate()
    except (TypeError, ValueError) as e:
        raise UserError(f"bad model override: {e}") from e
    return args
