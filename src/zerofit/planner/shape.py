"""What the planner needs to know about a model and a machine, from whatever the user has."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import torch

from zerofit.config import Config
from zerofit.errors import UserError


@dataclass(frozen=True)
class ModelShape:
    """A decoder-only transformer, in the numbers memory and FLOPs depend on."""

    name: str
    n_layers: int
    dim: int
    n_heads: int
    n_kv_heads: int
    ffn_dim: int
    vocab_size: int
    tied_embeddings: bool = False

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    @property
    def block_params(self) -> int:
        kv = self.n_kv_heads * self.head_dim
        attn = 2 * self.dim * self.dim + 2 * self.dim * kv
        return attn + 3 * self.dim * self.ffn_dim + 2 * self.dim

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.dim

    @property
    def root_params(self) -> int:
        """Parameters outside the blocks: embedding, final norm, output head (if untied)."""
        return self.embedding_params * (1 if self.tied_embeddings else 2) + self.dim

    @property
    def num_params(self) -> int:
        return self.n_layers * self.block_params + self.root_params

    def flops_per_token(self, seq_len: int) -> float:
        """6 x (params - input embedding) + 12 x layers x dim x seq (PaLM/torchtitan convention)."""
        dense = self.num_params - (0 if self.tied_embeddings else self.embedding_params)
        return 6.0 * dense + 12.0 * self.n_layers * self.dim * seq_len


def shape_from_preset(preset: str, overrides: dict | None = None) -> ModelShape:
    from zerofit.models import _llama_args  # validated, with overrides

    a = _llama_args(preset, overrides)
    return ModelShape(preset, a.n_layers, a.dim, a.n_heads, a.n_kv_heads, a.ffn_dim, a.vocab_size)


def shape_from_config(cfg: Config) -> ModelShape:
    """The shape of a zerofit config's model (preset with overrides, or HF config.json)."""
    m = cfg.model
    return shape_from_hf_config(m.hf) if m.hf else shape_from_preset(m.preset, m.overrides)


def shape_from_hf_config(path: str) -> ModelShape:
    """From a Hugging Face config.json (a file or the directory holding it); no transformers needed."""
    p = Path(path)
    p = p / "config.json" if p.is_dir() else p
    if not p.is_file():
        raise UserError(f"no config.json at {path}")
    try:
        c = json.loads(p.read_text())
        heads = c["num_attention_heads"]
        return ModelShape(
            name=c.get("_name_or_path") or p.parent.name,
            n_layers=c["num_hidden_layers"],
            dim=c["hidden_size"],
            n_heads=heads,
            n_kv_heads=c.get("num_key_value_heads") or heads,
            ffn_dim=c["intermediate_size"],
            vocab_size=c["vocab_size"],
            tied_embeddings=bool(c.get("tie_word_embeddings", False)),
        )
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        raise UserError(f"{p}: not a decoder config the planner understands ({e})") from None


_SIZE = re.compile(r"^\s*([0-9.]+)\s*([KMGTP]?)(i?)B?\s*$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """'40GiB' -> bytes (binary), '2TB' -> bytes (decimal), '512G' -> GiB."""
    m = _SIZE.match(text)
    if not m:
        raise UserError(f"cannot read a size from '{text}' (examples: 40GiB, 80GB, 2TB)")
    value, unit, binary = float(m.group(1)), m.group(2).upper(), m.group(3)
    power = " KMGTP".index(unit) if unit else 0
    base = 1024 if (binary or (unit and not text.strip().upper().endswith("B"))) else 1000
    return int(value * base**power)


@dataclass(frozen=True)
class Hardware:
    gpus_per_node: int
    gpu_mem: int  # bytes per GPU
    nodes: int = 1
    cpu_mem: int = 0  # bytes of host RAM per node
    nvme: int = 0  # bytes of NVMe per node
    peak_flops: float = 989e12  # dense bf16 per GPU
    intra_bw: float = 300e9  # bytes/s per GPU for collectives inside a node (NVLink class)
    inter_bw: float = 25e9  # bytes/s per GPU across nodes (200 Gb/s class)
    pcie_bw: float = 25e9  # bytes/s host<->GPU
    name: str = "GPU"

    @property
    def world_size(self) -> int:
        return self.gpus_per_node * self.nodes


def detect_hardware() -> Hardware | None:
    """This machine's GPUs, host RAM and disk, or None without a GPU."""
    if not torch.cuda.is_available():
        return None
    import os
    import shutil

    from zerofit.metrics import peak_flops

    props = torch.cuda.get_device_properties(0)
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return Hardware(
        gpus_per_node=torch.cuda.device_count(),
        gpu_mem=props.total_memory,
        cpu_mem=ram,
        nvme=shutil.disk_usage("/").free,
        peak_flops=peak_flops(torch.device("cuda", 0)) or 989e12,
        name=props.name,
    )
