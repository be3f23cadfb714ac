"""From a data config to training rows: read, tokenize (cached in memory per process), pack and
split. ``text`` rows are [N, seq_len + 1]; fine-tuning rows [N, 3, seq_len] (see packing);
preference rows [N, 4, seq_len], split by pair before packing (see pair_rows)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import numpy as np

from zerofit.data.formats import field_names
from zerofit.data.packing import (
    PackStats,
    fit_samples,
    pack,
    pack_samples,
    split_train_val,
    tokenize_stream,
)
from zerofit.data.pair_rows import PairStats, fit_pairs, pack_pairs, split_pairs
from zerofit.data.pairs import FORMAT, Pair, render_pairs
from zerofit.data.samples import Sample, has_chat_template, render_samples
from zerofit.data.sizing import GlobalBatch, RowSupply, check_rows, val_rows
from zerofit.data.sources import iter_documents, iter_sample_records
from zerofit.data.tokenizers import AnyTokenizer, load_tokenizer
from zerofit.errors import UserError

_CACHE: dict[tuple, object] = {}
_CACHE_MAX = 4
T = TypeVar("T")


@dataclass(frozen=True)
class SampleOptions:
    """How fine-tuning records become rows (data.format prompt_completion, chat, sharegpt,
    alpaca or preference). The record fields read: see formats.field_names."""

    format: str  # "prompt_completion" | "chat" | "sharegpt" | "alpaca" | "preference"
    prompt_field: str = "prompt"
    completion_field: str = "completion"
    messages_field: str | None = None  # messages (chat), conversations (sharegpt)
    train_on: str = "completion"  # "completion" | "all"
    overlong: str = "truncate"  # "truncate" | "drop" | "error"
    packing: bool = True
    columns: tuple[tuple[str, str], ...] = ()  # data.columns: {the format's field name: yours}
    roles: tuple[tuple[str, str], ...] = ()  # data.roles: a record's role -> the template's
    chosen_field: str = "chosen"  # preference
    rejected_field: str = "rejected"

    def fields(self) -> dict[str, str]:
        return field_names(
            self.format,
            dict(self.columns),
            prompt=self.prompt_field,
            completion=self.completion_field,
            messages=self.messages_field,
            chosen=self.chosen_field,
            rejected=self.rejected_field,
        )

    def role_map(self) -> dict[str, str]:
        return dict(self.roles)

    def key(self) -> tuple:
        """What decides the samples (the in-memory cache's key)."""
        return (self.format, tuple(self.fields().items()), self.roles, self.train_on)


@dataclass
class DataBundle:
    tokenizer: AnyTokenizer
    train: np.ndarray  # text: [N_train, seq_len + 1]; samples: [N_train, 3, seq_len]; pairs:
    # [N_train, 4, seq_len] (int32; channel 3: pair ids, see zerofit.data.pair_rows)
    val: np.ndarray
    seq_len: int
    num_tokens: int  # tokens read (text: in the stream before packing)
    stats: PackStats | None = None  # fine-tuning samples: what packing did with them
    options: SampleOptions | None = None
    label: str | None = None  # how the samples were rendered, e.g. "alpaca as chat"
    n_pairs: tuple[int, int] | None = None  # preference: (train, val) pairs; ids g in 0..n-1

    @property
    def masked(self) -> bool:
        """Whether rows carry positions and masked targets (fine-tuning samples and pairs)."""
        return self.train.ndim == 3

    @property
    def paired(self) -> bool:
        """Whether rows carry pair ids (data.format preference): batches are 4-tuples."""
        return self.train.ndim == 3 and self.train.shape[1] == 4

    def report_line(self) -> str | None:
        """What packing did, for the run's start (None for text)."""
        if self.stats is None or self.options is None:
            return None
        label = self.label or self.options.format
        return f"data ({label}): {self.stats.line(self.options.packing)}"


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
        raise UserError(
            f"data has only {len(stream)} tokens: not one sequence of {seq_len + 1}; lower "
            "model.seq_len or add data"
        )
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
    key = (sources, tokenizer, opts.key(), max_tokens)

    def make() -> list[Sample]:
        records = iter_sample_records(source)
        fmt, fields, roles = opts.format, opts.fields(), opts.role_map()
        return list(
            render_samples(records, tok, fmt, fields, opts.train_on, tokenizer, max_tokens, roles)
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


def _supply(
    rows: int, tokens: int, max_tokens: int | None, stats: PackStats | None, packing: bool
) -> RowSupply:
    """What the rows came from, and how to get more of them (for the small-data error line)."""
    more = ["a lower model.seq_len"] if stats is None or packing else []
    if max_tokens is not None and tokens >= max_tokens:
        more.append(f"a higher data.max_tokens (now {max_tokens})")
    more.append("more data")
    if stats is None:
        return RowSupply(rows, f"{rows} row{'s' * (rows != 1)} of text", None, tuple(more))
    kept = stats.samples - stats.dropped_samples - stats.skipped_samples
    what = f"{rows} {'packed ' if packing else ''}row{'s' * (rows != 1)} ({kept} samples)"
    return RowSupply(rows, what, kept if packing else None, tuple(more))


def build_data(
    source: str | list[str],
    tokenizer: str,
    field: str,
    seq_len: int,
    val_fraction: float,
    max_tokens: int | None,
    seed: int = 0,
    samples: SampleOptions | None = None,
    global_batch: GlobalBatch | None = None,
) -> DataBundle:
    """Tokenize, pack and split: documents (``samples`` None: data.format text) or fine-tuning
    samples. Too few rows for the validation hold-out and one ``global_batch`` (None: one row)
    is one UserError naming every fix (``zerofit.data.sizing``); ``PackedLoader`` checks the
    global batch again."""
    if seq_len < 1:
        raise UserError(f"seq_len must be >= 1, got {seq_len}")
    if not 0.0 <= val_fraction < 1.0:
        raise UserError(f"val_fraction must be in [0, 1), got {val_fraction}")
    tok = load_tokenizer(tokenizer)
    if samples is not None and samples.format == FORMAT:
        rendered = cached_pairs(source, tok, tokenizer, samples, max_tokens)
        return _pair_data(
            rendered, tok, samples, seq_len, val_fraction, seed, global_batch, max_tokens
        )
    stats = None
    if samples is None:
        rows, num_tokens = _text_rows(source, tok, tokenizer, field, seq_len, max_tokens)
    else:
        rows, stats = _sample_rows(source, tok, tokenizer, samples, seq_len, max_tokens)
        num_tokens = stats.tokens
    packing = samples is None or samples.packing
    supply = _supply(len(rows), num_tokens, max_tokens, stats, packing)
    check_rows(supply, val_fraction, global_batch)
    train, val = split_train_val(rows, val_fraction, seed)
    if samples is None:
        return DataBundle(tok, train, val, seq_len, num_tokens)
    return DataBundle(tok, train, val, seq_len, num_tokens, stats, samples, _label(samples, tok))


def cached_pairs(
    source: str | list[str],
    tok: AnyTokenizer,
    tokenizer: str,
    opts: SampleOptions,
    max_tokens: int | None,
) -> list[Pair]:
    """The records' pairs as read, before any cut (cached in memory per process, like samples;
    ``zerofit data preview`` reads their lengths here)."""
    key = (
        tuple([source] if isinstance(source, str) else source),
        tokenizer,
        opts.key(),
        max_tokens,
    )
    fields, roles = opts.fields(), opts.role_map()

    def make() -> list[Pair]:
        records = iter_sample_records(source)
        return list(render_pairs(records, tok, fields, opts.train_on, tokenizer, max_tokens, roles))

    return _cached(key, make)


def _pair_data(
    pairs: list[Pair],
    tok: AnyTokenizer,
    opts: SampleOptions,
    seq_len: int,
    val_fraction: float,
    seed: int,
    global_batch: GlobalBatch | None,
    max_tokens: int | None,
) -> DataBundle:
    """Preference pairs: fitted, split by pair, each side packed (ids g from 0 in each)."""
    kept, stats = fit_pairs(pairs, seq_len, opts.overlong)
    if not kept:
        raise UserError(
            f"no usable pair in data.source ({stats.samples} read, {stats.dropped_samples} "
            f"dropped, {stats.skipped_samples} with no token to learn)"
        )
    held, n = val_rows(len(kept), val_fraction), len(kept)
    if held >= n:
        raise UserError(
            f"data: {n} pair{' is' if n == 1 else 's are'} too few to hold out {held} for "
            f"validation (data.val_fraction={val_fraction}) and train on the rest; set "
            "data.val_fraction=0 or add data"
        )
    train_pairs, val_pairs = split_pairs(kept, val_fraction, seed)
    train, train_fill = pack_pairs(train_pairs, seq_len, opts.packing)
    val, val_fill = pack_pairs(val_pairs, seq_len, opts.packing)
    stats.rows = len(train) + len(val)
    stats.train_pairs, stats.val_pairs = len(train_pairs), len(val_pairs)
    stats.fill = (train_fill * len(train) + val_fill * len(val)) / stats.rows
    supply = _pair_supply(len(train), stats, opts.packing, val_fraction, max_tokens)
    check_rows(supply, 0.0, global_batch)  # the val pairs are held out already
    n_pairs = (len(train_pairs), len(val_pairs))
    return DataBundle(tok, train, val, seq_len, stats.tokens, stats, opts, FORMAT, n_pairs)


def _pair_supply(
    rows: int, stats: PairStats, packing: bool, val_fraction: float, max_tokens: int | None
) -> RowSupply:
    """The training rows the pairs gave, and how to get more (for the small-data error line)."""
    more = ["a lower model.seq_len"] if packing else []
    if max_tokens is not None and stats.tokens >= max_tokens:
        more.append(f"a higher data.max_tokens (now {max_tokens})")
    if val_fraction:
        more.append(f"data.val_fraction=0 (it holds out {stats.val_pairs} pairs)")
    more.append("more data")
    what = f"{rows} {'packed ' if packing else ''}training row{'s' * (rows != 1)}"
    what += f" ({stats.train_pairs} pairs)"
    return RowSupply(rows, what, stats.train_pairs if packing else None, tuple(more))


def _label(opts: SampleOptions, tok: AnyTokenizer) -> str:
    if opts.format != "alpaca":
        return opts.format
    return "alpaca as chat" if has_chat_template(tok) else "alpaca as prompt_completion"
