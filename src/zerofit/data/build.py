"""From a data config to training rows: read, tokenize (cached in memory per process), pack and
split. ``text`` rows are [N, seq_len + 1]; fine-tuning rows [N, 3, seq_len] (see packing)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import numpy as np

from zerofit.data.packing import (
    PackStats,
    fit_samples,
    pack,
    pack_samples,
    split_train_val,
    tokenize_stream,
)
from zerofit.data.samples import Sample, render_samples
from zerofit.data.sources import iter_documents, iter_sample_records
from zerofit.data.tokenizers import AnyTokenizer, load_tokenizer
from zerofit.errors import UserError

_CACHE: dict[tuple, object] = {}
_CACHE_MAX = 4
T = TypeVar("T")


@dataclass(frozen=True)
class SampleOptions:
    """How fine-tuning records become rows (data.format prompt_completion or chat)."""

    format: str  # "prompt_completion" | "chat"
    prompt_field: str = "prompt"
    completion_field: str = "completion"
    messages_field: str = "messages"
    train_on: str = "completion"  # "completion" | "all"
    overlong: str = "truncate"  # "truncate" | "drop" | "error"
    packing: bool = True

    def fields(self) -> dict[str, str]:
        return {
            "prompt": self.prompt_field,
            "completion": self.completion_field,
            "messages": self.messages_field,
        }


@dataclass
class DataBundle:
    tokenizer: AnyTokenizer
    train: np.ndarray  # text: [N_train, seq_len + 1]; samples: [N_train, 3, seq_len] (int32)
    val: np.ndarray
    seq_len: int
    num_tokens: int  # tokens read (text: in the stream before packing)
    stats: PackStats | None = None  # fine-tuning samples: what packing did with them
    options: SampleOptions | None = None

    @property
    def masked(self) -> bool:
        """Whether rows carry positions and masked targets (fine-tuning samples)."""
        return self.train.ndim == 3

    def report_line(self) -> str | None:
        """What packing did, for the run's start (None for text)."""
        if self.stats is None or self.options is None:
            return None
        return f"data ({self.options.format}): {self.stats.line(self.options.packing)}"


def _cached(key: tuple, make: Callable[[], T]) -> T:
    value = _CACHE.get(key)
    if value is None:
        value = make()
        if len(_CACHE) >= _CACHE_MAX:
            _CACHE.pop(next(iter(_CACHE)))
        _CACHE[key] = value
    return value  # type: ignore[return-value]


def _text_rows(
    source: str | list[str],
    tok: AnyTokenizer,
    tokenizer: str,
    field: str,
    seq_len: int,
    max_tokens: int | None,
) -> tuple[np.ndarray, int]:
    key = (tuple([source] if isinstance(source, str) else source), tokenizer, field, max_tokens)
    stream = _cached(key, lambda: tokenize_stream(iter_documents(source, field), tok, max_tokens))
    seqs = pack(stream, seq_len)
    if len(seqs) == 0:
        raise UserError(f"data has only {len(stream)} tokens: not one sequence of {seq_len + 1}")
    return seqs, len(stream)


def _sample_rows(
    source: str | list[str],
    tok: AnyTokenizer,
    tokenizer: str,
    opts: SampleOptions,
    seq_len: int,
    max_tokens: int | None,
) -> tuple[np.ndarray, PackStats]:
    sources = tuple([source] if isinstance(source, str) else source)
    fields = opts.fields()
    key = (sources, tokenizer, opts.format, tuple(fields.items()), opts.train_on, max_tokens)

    def make() -> list[Sample]:
        records = iter_sample_records(source)
        return list(
            render_samples(records, tok, opts.format, fields, opts.train_on, tokenizer, max_tokens)
        )

    samples, stats = fit_samples(_cached(key, make), seq_len, opts.overlong)
    rows, stats.fill = pack_samples(samples, seq_len, opts.packing)
    stats.rows = len(rows)
    if len(rows) == 0:
        raise UserError(
            f"no usable sample in data.source ({stats.samples} read, {stats.dropped_samples} "
            f"dropped, {stats.skipped_samples} with no token to learn)"
        )
    return rows, stats


def build_data(
    source: str | list[str],
    tokenizer: str,
    field: str,
    seq_len: int,
    val_fraction: float,
    max_tokens: int | None,
    seed: int = 0,
    samples: SampleOptions | None = None,
) -> DataBundle:
    """Tokenize, pack and split: documents (``samples`` None: data.format text) or fine-tuning
    samples. The caller checks that train is big enough for a global batch (``PackedLoader``
    raises UserError if not)."""
    if seq_len < 1:
        raise UserError(f"seq_len must be >= 1, got {seq_len}")
    tok = load_tokenizer(tokenizer)
    if samples is None:
        rows, num_tokens = _text_rows(source, tok, tokenizer, field, seq_len, max_tokens)
        train, val = split_train_val(rows, val_fraction, seed)
        return DataBundle(tok, train, val, seq_len, num_tokens)
    rows, stats = _sample_rows(source, tok, tokenizer, samples, seq_len, max_tokens)
    train, val = split_train_val(rows, val_fraction, seed)
    return DataBundle(tok, train, val, seq_len, stats.tokens, stats, samples)
