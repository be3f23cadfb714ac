"""Tokenizers, document sources, packing, train/val split and the sharded, resumable loader.

Sequence layout of one global batch (``B`` = micro batch size, ``A`` = grad-accum steps,
``D`` = data-parallel size): micro-step ``a`` on rank ``r`` takes the permutation entries at
offsets ``a*D*B + r*B + [0, B)``. So one process with ``A=2`` sees exactly the micro-batches
that two ranks with ``A=1`` see, which the parity tests rely on.
"""

from __future__ import annotations

import json
import os
import sysconfig
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np
import torch

from zerofit.errors import UserError
from zerofit.limits import shown

EOS_CANDIDATES = ("<|end_of_text|>", "<|endoftext|>", "</s>", "<eos>")
_SKIP_DIRS = frozenset(
    {"site-packages", "dist-packages", "test", "tests", "idlelib", "__pycache__"}
)


class Tokenizer(Protocol):
    vocab_size: int
    eos_id: int | None

    def encode(self, text: str) -> np.ndarray: ...
    def encode_batch(self, texts: list[str]) -> list[np.ndarray]: ...
    def decode(self, ids: Iterable[int]) -> str: ...


class ByteTokenizer:
    """Ids 0..255 are the UTF-8 bytes of the text; 256 is EOS."""

    vocab_size = 257
    eos_id: int | None = 256

    def encode(self, text: str) -> np.ndarray:
        data = text.encode("utf-8", errors="surrogatepass")
        return np.frombuffer(data, dtype=np.uint8).astype(np.int32)

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        return [self.encode(t) for t in texts]

    def decode(self, ids: Iterable[int]) -> str:
        return bytes(int(i) for i in ids if 0 <= int(i) < 256).decode("utf-8", errors="replace")


class HFTokenizer:
    """A local ``tokenizer.json`` loaded with the ``tokenizers`` library."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        from tokenizers import Tokenizer as _Tok

        self.path = str(path)
        try:
            self._tok = _Tok.from_file(self.path)
        except Exception as e:  # the library raises plain Exceptions for bad files
            raise UserError(
                f"cannot load tokenizer {shown(self.path, quote=False)}: {shown(e, quote=False)}"
            ) from None
        self.vocab_size: int = self._tok.get_vocab_size(with_added_tokens=True)
        self.eos_id: int | None = None
        for name in EOS_CANDIDATES:
            tid = self._tok.token_to_id(name)
            if tid is not None:
                self.eos_id = int(tid)
                break

    def encode(self, text: str) -> np.ndarray:
        return np.asarray(self._tok.encode(text, add_special_tokens=False).ids, dtype=np.int32)

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        encs = self._tok.encode_batch(texts, add_special_tokens=False)
        return [np.asarray(e.ids, dtype=np.int32) for e in encs]

    def decode(self, ids: Iterable[int]) -> str:
        return self._tok.decode([int(i) for i in ids])


def load_tokenizer(spec: str) -> ByteTokenizer | HFTokenizer:
    """``"byte"``, a path to a ``tokenizer.json``, or a directory holding one."""
    if spec == "byte":
        return ByteTokenizer()
    path = Path(spec).expanduser()
    if path.is_dir():
        path = path / "tokenizer.json"
    if not path.is_file():
        raise UserError(
            f"tokenizer file not found: {shown(path, quote=False)} (use 'byte' or a tokenizer.json path)"
        )
    return HFTokenizer(path)


# ----------------------------------------------------------------------------- sources


def stdlib_files() -> list[Path]:
    """The interpreter's own standard-library ``.py`` files, in a deterministic order."""
    root = sysconfig.get_paths()["stdlib"]
    out: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS)
        out.extend(Path(dirpath, f) for f in sorted(filenames) if f.endswith(".py"))
    return out


def _iter_jsonl(path: Path, field: str) -> Iterator[str]:
    with path.open("r", encoding="utf-8", errors="replace") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise UserError(f"{path}:{lineno}: invalid JSON ({e.msg})") from None
            if not isinstance(obj, dict) or field not in obj:
                raise UserError(f"{path}:{lineno}: no field {field!r} in this JSON line")
            value = obj[field]
            if not isinstance(value, str):
                raise UserError(f"{path}:{lineno}: field {field!r} is not a string")
            yield value


def _iter_path(path: Path, field: str) -> Iterator[str]:
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in (".txt", ".jsonl"))
        if not files:
            raise UserError(f"no .txt or .jsonl files in directory {path}")
        for f in files:
            yield from _iter_path(f, field)
    elif path.suffix == ".jsonl":
        yield from _iter_jsonl(path, field)
    else:  # .txt or anything else: the whole file is one document
        yield path.read_text(encoding="utf-8", errors="replace")


def iter_documents(source: str | list[str], field: str = "text") -> Iterator[str]:
    """Documents from ``"stdlib"``, a .txt/.jsonl file, a directory, or a list of these.

    Empty documents are skipped. Paths are checked up front so a typo fails fast.
    """
    sources = [source] if isinstance(source, str) else list(source)
    if not sources:
        raise UserError("data source list is empty")
    for s in sources:
        if s != "stdlib" and not Path(s).expanduser().exists():
            raise UserError(f"data source not found: {shown(s, quote=False)}")
    for s in sources:
        if s == "stdlib":
            docs: Iterator[str] = (
                p.read_text(encoding="utf-8", errors="replace") for p in stdlib_files()
            )
        else:
            docs = _iter_path(Path(s).expanduser(), field)
        for doc in docs:
            if doc:
                yield doc


# ----------------------------------------------------------------------------- packing

_CACHE: dict[tuple, np.ndarray] = {}
_CACHE_MAX = 4


def tokenize_stream(
    docs: Iterable[str], tok: Tokenizer, max_tokens: int | None = None, batch_docs: int = 64
) -> np.ndarray:
    """All documents tokenized and concatenated, each followed by EOS (if the tokenizer has
    one), truncated to ``max_tokens``. Stops reading documents once the cap is reached."""
    parts: list[np.ndarray] = []
    total = 0
    eos = None if tok.eos_id is None else np.asarray([tok.eos_id], dtype=np.int32)
    batch: list[str] = []

    def flush() -> None:
        nonlocal total
        for ids in tok.encode_batch(batch):
            parts.append(ids)
            total += len(ids)
            if eos is not None:
                parts.append(eos)
                total += 1
        batch.clear()

    for doc in docs:
        batch.append(doc)
        if len(batch) >= batch_docs:
            flush()
            if max_tokens is not None and total >= max_tokens:
                break
    flush()  # the remainder (empty after a break)
    stream = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int32)
    return stream[:max_tokens] if max_tokens is not None else stream


def pack(stream: np.ndarray, seq_len: int) -> np.ndarray:
    """Cut a token stream into non-overlapping rows of ``seq_len + 1`` (inputs=row[:-1],
    targets=row[1:]). The tail that does not fill a row is dropped."""
    if seq_len < 1:
        raise UserError(f"seq_len must be >= 1, got {seq_len}")
    n = len(stream) // (seq_len + 1)
    return np.ascontiguousarray(stream[: n * (seq_len + 1)].reshape(n, seq_len + 1))


def split_train_val(
    sequences: np.ndarray, val_fraction: float, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """A seeded, deterministic, disjoint split; at least one val row when val_fraction > 0."""
    if not 0.0 <= val_fraction < 1.0:
        raise UserError(f"val_fraction must be in [0, 1), got {val_fraction}")
    n = len(sequences)
    n_val = 0 if val_fraction == 0 else max(1, round(n * val_fraction))
    if n_val >= n:
        raise UserError(f"only {n} packed sequences: too few to hold out {n_val} for validation")
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed)).numpy()
    is_val = np.zeros(n, dtype=bool)
    is_val[perm[:n_val]] = True
    return sequences[~is_val], sequences[is_val]


@dataclass
class DataBundle:
    tokenizer: ByteTokenizer | HFTokenizer
    train: np.ndarray  # [N_train, seq_len + 1] int32
    val: np.ndarray  # [N_val, seq_len + 1] int32
    seq_len: int
    num_tokens: int  # tokens in the stream before packing


def build_data(
    source: str | list[str],
    tokenizer: str,
    field: str,
    seq_len: int,
    val_fraction: float,
    max_tokens: int | None,
    seed: int = 0,
) -> DataBundle:
    """Tokenize (cached in memory per process), pack and split. The caller checks that train
    is big enough for a global batch (``PackedLoader`` raises UserError if not)."""
    tok = load_tokenizer(tokenizer)
    key = (tuple([source] if isinstance(source, str) else source), tokenizer, field, max_tokens)
    stream = _CACHE.get(key)
    if stream is None:
        stream = tokenize_stream(iter_documents(source, field), tok, max_tokens)
        if len(_CACHE) >= _CACHE_MAX:
            _CACHE.pop(next(iter(_CACHE)))
        _CACHE[key] = stream
    seqs = pack(stream, seq_len)
    if len(seqs) == 0:
        raise UserError(f"data has only {len(stream)} tokens: not one sequence of {seq_len + 1}")
    train, val = split_train_val(seqs, val_fraction, seed)
    return DataBundle(tok, train, val, seq_len, len(stream))


# ----------------------------------------------------------------------------- loading


def _to_batch(rows: np.ndarray | torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    t = torch.as_tensor(rows).to(torch.int64)
    return t[:, :-1].contiguous(), t[:, 1:].contiguous()


class PackedLoader:
    """Endless, sharded, seeded micro-batch stream over packed train sequences."""

    def __init__(
        self,
        sequences: np.ndarray | torch.Tensor,
        *,
        micro_batch_size: int,
        grad_accum_steps: int,
        dp_rank: int,
        dp_size: int,
        seed: int,
        shuffle: bool = True,
    ) -> None:
        if micro_batch_size < 1 or grad_accum_steps < 1 or dp_size < 1:
            raise UserError("micro_batch_size, grad_accum_steps and dp_size must be >= 1")
        if not 0 <= dp_rank < dp_size:
            raise UserError(f"dp_rank {dp_rank} out of range for dp_size {dp_size}")
        self.sequences = sequences
        self.B, self.A, self.rank, self.D = micro_batch_size, grad_accum_steps, dp_rank, dp_size
        self.seed, self.shuffle = seed, shuffle
        self.global_batch = micro_batch_size * grad_accum_steps * dp_size
        self.n = len(sequences)
        if self.n < self.global_batch:
            raise UserError(
                f"only {self.n} train sequences but one global batch needs {self.global_batch} "
                f"(micro_batch_size {micro_batch_size} x grad_accum {grad_accum_steps} x "
                f"dp {dp_size}); add data, raise max_tokens or shrink the batch/seq_len"
            )
        self.epoch = 0
        self.position = 0  # offset in this epoch's permutation of the current global batch
        self.micro = 0  # next micro-step within the current global batch
        self._perm: torch.Tensor | None = None
        self._perm_epoch = -1

    def _permutation(self) -> torch.Tensor:
        if self._perm_epoch != self.epoch:
            if self.shuffle:
                g = torch.Generator().manual_seed(self.seed + self.epoch)
                self._perm = torch.randperm(self.n, generator=g)
            else:
                self._perm = torch.arange(self.n)
            self._perm_epoch = self.epoch
        assert self._perm is not None
        return self._perm

    def next_microbatch(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self.position + self.global_batch > self.n:  # remainder dropped: next epoch
            self.epoch += 1
            self.position = 0
        start = self.position + self.micro * self.D * self.B + self.rank * self.B
        idx = self._permutation()[start : start + self.B].numpy()
        self.micro += 1
        if self.micro == self.A:
            self.micro = 0
            self.position += self.global_batch
        return _to_batch(self.sequences[idx])

    def state_dict(self) -> dict:
        return {
            "epoch": self.epoch,
            "position": self.position,
            "micro": self.micro,
            "seed": self.seed,
            "num_sequences": self.n,
        }

    def load_state_dict(self, d: dict) -> None:
        n = d.get("num_sequences", self.n)
        if n != self.n:
            raise UserError(
                f"data loader state is for {n} train sequences but the data now has {self.n}; "
                "the data, tokenizer or seq_len changed since the checkpoint"
            )
        self.epoch = int(d["epoch"])
        self.position = int(d["position"])
        self.micro = int(d.get("micro", 0))
        self.seed = int(d.get("seed", self.seed))


def eval_batches(
    sequences: np.ndarray | torch.Tensor,
    micro_batch_size: int,
    dp_rank: int,
    dp_size: int,
    max_batches: int | None = None,
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Fixed, unshuffled eval micro-batches for this rank (same layout as training, A=1).

    Every rank gets the same number of full batches: ``min(max_batches, N // (B*D))``, but at
    least one, wrapping around the val set when it is smaller than one global batch.
    """
    n, gb = len(sequences), micro_batch_size * dp_size
    if n == 0:
        return []
    n_batches = n // gb
    if max_batches is not None:
        n_batches = min(n_batches, max_batches)
    n_batches = max(1, n_batches)
    out = []
    for k in range(n_batches):
        start = k * gb + dp_rank * micro_batch_size
        idx = np.arange(start, start + micro_batch_size) % n
        out.append(_to_batch(sequences[idx]))
    return out
