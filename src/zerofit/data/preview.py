"""What a run will train on, before it starts (``zerofit data preview``).

``build_preview(cfg)`` builds the rows with ``zerofit.train.inputs.run_data``, as a run builds them
(no model, no process group), then:

- ``row_view`` cuts a row into its samples (fine-tuning rows are [3, seq_len]: inputs, targets
  with -100 where no loss falls, positions restarting at 0 for each sample; the rest of a row is
  padding), its pairs' chosen and rejected documents (preference rows, [4, seq_len]: the fourth
  channel names each loss place's pair) or, for ``data.format: text``, into documents (split
  after each EOS), and decodes it token by token (``readable_pieces``) with the loss-bearing
  tokens marked;
- ``Preview.count_lines`` counts samples (or pairs), tokens, loss tokens, rows, fill, what was cut.

The terminal view is in ``zerofit.commands.data``; the HTML page and the histogram in
``zerofit.data.preview_html``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from zerofit.config import Config
from zerofit.data.build import DataBundle, cached_pairs
from zerofit.data.packing import IGNORE_INDEX, PackStats, tokenize_stream
from zerofit.data.pair_rows import PairStats
from zerofit.data.samples import render_samples
from zerofit.data.sources import iter_documents, iter_sample_records
from zerofit.data.tokenizers import AnyTokenizer, ByteTokenizer, FolderTokenizer
from zerofit.train.inputs import run_data

CONTEXT_TOKENS = 4  # tokens decoded before each one, so SentencePiece spaces and bytes survive
VISIBLE = {"\n": "↵\n", "\r": "␍", "\t": "⇥", "\x7f": "␡"}


@dataclass
class Token:
    id: int
    text: str  # its readable piece ("" for the first bytes of a character cut across tokens)
    loss: bool  # a loss target: predicted from the tokens before it, with loss
    special: bool = False


@dataclass
class Segment:
    """A sample (or, in text rows, a piece of a document; in preference rows, a pair's chosen or
    rejected document) within a row, or the row's padding."""

    kind: str  # "sample" | "document" | "padding" | "chosen" | "rejected"
    places: int  # row places it takes
    tokens: list[Token] = field(default_factory=list)  # decoded (up to the display limit)
    size: int = 0  # tokens the model sees of it (a sample's last one only as a target)
    loss: int = 0  # of which loss targets
    pair: int | None = None  # chosen / rejected: the pair's id g in its split

    def head(self, number: int) -> str:
        if self.kind == "padding":
            return f"padding: {self.places} places, no loss"
        shown = "" if len(self.tokens) == self.size else f", {len(self.tokens)} shown"
        name = f"{self.kind} {number}" if self.pair is None else f"pair {self.pair}, {self.kind}"
        return f"{name}: {self.size} tokens, {self.loss} with loss{shown}"


@dataclass
class Preview:
    data: DataBundle
    format: str
    lengths: list[int]  # tokens of each sample (text: document) as read, before any cut
    loss_tokens: int  # targets with loss in every row (train and val)
    placed: int  # row places holding tokens (inputs)

    @property
    def seq_len(self) -> int:
        return self.data.seq_len

    @property
    def rows(self) -> int:
        return len(self.data.train) + len(self.data.val)

    @property
    def unit(self) -> str:
        """What ``lengths`` measures."""
        return (
            "documents" if self.data.stats is None else "pairs" if self.data.paired else "samples"
        )

    @property
    def fits(self) -> int:
        """The most tokens of one unit a row holds (a pair: two documents of L - 1 places each)."""
        return self.seq_len + (2 if self.data.paired else 1)

    def count_lines(self) -> list[tuple[str, str]]:
        """(what, how many) for the counts table."""
        stats = self.data.stats
        n, unit = len(self.lengths), self.unit
        out = [
            ("format", _format(self)),
            (unit, f"{stats.samples if stats else n:,}"),
            ("tokens read", f"{self.data.num_tokens:,}"),
            (
                "loss tokens",
                f"{self.loss_tokens:,} ({_share(self.loss_tokens, self.placed)} of tokens in rows)",
            ),
            ("packed rows (train / val)", f"{len(self.data.train):,} / {len(self.data.val):,}"),
            ("seq_len", f"{self.seq_len:,}"),
            ("fill", _share(self.placed, self.rows * self.seq_len)),
        ]
        out += _cut_lines(stats, self.data.num_tokens - self.rows * (self.seq_len + 1), unit)
        out += _pair_lines(stats)
        if n:
            q = np.percentile(np.asarray(self.lengths), [50, 95])
            spread = [min(self.lengths), round(q[0]), round(q[1]), max(self.lengths)]
            out.append(
                (f"{unit[:-1]} length min/median/p95/max", " / ".join(f"{v:,}" for v in spread))
            )
        return out

    def note(self) -> str:
        if self.data.stats is None:
            return (
                "data.format text: no masks; every token is a loss target but the first of each "
                "row (documents run across rows, separated by EOS)"
            )
        if self.data.paired:
            return (
                "each pair is its chosen then its rejected document; the marked tokens are the "
                "responses' tokens scored for DPO, each predicted from the tokens before it"
            )
        return "loss falls on the marked tokens: each is predicted from the tokens before it"


def _format(p: Preview) -> str:
    opts = p.data.options
    if opts is None:
        return p.format
    return f"{p.data.label or p.format} (train_on={opts.train_on})"


def _share(part: int, whole: int) -> str:
    return f"{part / whole:.1%}" if whole else "-"


def _cut_lines(stats: PackStats | None, tail: int, unit: str) -> list[tuple[str, str]]:
    if stats is None:
        return [("tail tokens left out", f"{tail:,}")]
    out = [
        (
            f"truncated {unit}",
            f"{stats.truncated_samples:,} ({stats.truncated_tokens:,} tokens cut)",
        ),
        (f"dropped {unit}", f"{stats.dropped_samples:,} ({stats.dropped_tokens:,} tokens)"),
    ]
    if stats.skipped_samples:
        out.append(("skipped (no loss token)", f"{stats.skipped_samples:,}"))
    return out


def _pair_lines(stats: PackStats | None) -> list[tuple[str, str]]:
    if not isinstance(stats, PairStats):
        return []
    out = [("pairs (train / val)", f"{stats.train_pairs:,} / {stats.val_pairs:,}")]
    if stats.identical_pairs:
        out.append(("chosen = rejected", f"{stats.identical_pairs:,} (nothing to learn)"))
    return out


def build_preview(cfg: Config) -> Preview:
    """The data of a run of ``cfg``, built as ``zerofit.train.inputs.build_inputs`` builds it."""
    d = cfg.data
    data = run_data(cfg)  # the ranks are not known here: no global-batch check
    rows = [r for r in (data.train, data.val) if len(r)]
    if not data.masked:
        n = sum(len(r) for r in rows) * data.seq_len
        return Preview(data, d.format, _document_lengths(cfg, data.tokenizer), n, n)
    loss = sum(int((r[:, 1] != IGNORE_INDEX).sum()) for r in rows)
    placed = sum(_placed(r) for r in rows)
    return Preview(data, d.format, _sample_lengths(cfg, data, rows), loss, placed)


def _placed(rows: np.ndarray) -> int:
    """Places holding sample tokens: all but the padding after each row's last sample (the last
    segment, when none of its targets carries loss: every sample has one)."""
    seq_len = rows.shape[2]
    starts = seq_len - 1 - np.argmax((rows[:, 2] == 0)[:, ::-1], axis=1)  # last restart
    tail_loss = np.cumsum((rows[:, 1] != IGNORE_INDEX)[:, ::-1], axis=1)[:, ::-1]
    padding = tail_loss[np.arange(len(rows)), starts] == 0
    return int(rows.shape[0] * seq_len - np.where(padding, seq_len - starts, 0).sum())


def _sample_lengths(cfg: Config, data: DataBundle, rows: list[np.ndarray]) -> list[int]:
    """Each sample's tokens as read. Read off the rows (a sample of L tokens takes L - 1 places)
    when none was cut, dropped or skipped; else rendered again, as ``build_data`` renders them."""
    s, opts = data.stats, data.options
    assert s is not None and opts is not None
    d = cfg.data
    if data.paired:  # each pair's tokens as read (as build_data read them: cached)
        pairs = cached_pairs(d.source, data.tokenizer, d.tokenizer, opts, d.max_tokens)
        return [p.tokens for p in pairs]
    if not (s.truncated_samples or s.dropped_samples or s.skipped_samples):
        segs = [seg for r in rows for row in r for seg in _segments(row)]
        return sorted(seg.places + 1 for seg in segs if seg.kind == "sample")
    records = iter_sample_records(d.source)
    fmt, fields, roles = opts.format, opts.fields(), opts.role_map()
    samples = render_samples(
        records, data.tokenizer, fmt, fields, opts.train_on, d.tokenizer, d.max_tokens, roles
    )
    return [len(x.ids) for x in samples]


def _document_lengths(cfg: Config, tok: AnyTokenizer) -> list[int]:
    """Tokens of each document (with its EOS), from the stream ``build_data`` tokenized."""
    d = cfg.data
    stream = tokenize_stream(iter_documents(d.source, d.field), tok, d.max_tokens)
    if tok.eos_id is None or not len(stream):
        return [len(stream)] if len(stream) else []
    ends = (np.flatnonzero(stream == tok.eos_id) + 1).tolist()
    if not ends or ends[-1] != len(stream):
        ends.append(len(stream))
    return np.diff([0, *ends]).tolist()


def _segments(row: np.ndarray) -> list[Segment]:
    """A fine-tuning row [3, seq_len] cut where positions restart at 0 (tokens not decoded); in a
    preference row [4, seq_len], each document named chosen or rejected, with its pair."""
    starts = [*np.flatnonzero(row[2] == 0).tolist(), row.shape[1]]
    out = []
    for a, b in zip(starts[:-1], starts[1:], strict=True):
        is_pad = b == row.shape[1] and not (row[1, a:b] != IGNORE_INDEX).any()
        seg = Segment("padding" if is_pad else "sample", b - a)
        ids = row[3, a:b][row[3, a:b] != 0] if len(row) > 3 and not is_pad else []
        if len(ids):
            seg.kind, seg.pair = ("chosen" if ids[0] > 0 else "rejected"), abs(int(ids[0])) - 1
        out.append(seg)
    return out


@dataclass
class RowView:
    segments: list[Segment]
    hidden: int  # tokens of the row not decoded (past the limit)

    def title(self) -> str:
        """What the row holds, e.g. "3 sample(s)", "2 pair(s)"."""
        parts = [s for s in self.segments if s.kind != "padding"]
        if parts and parts[0].pair is not None:
            return f"{len({s.pair for s in parts})} pair(s)"
        return f"{len(parts)} {parts[0].kind if parts else 'sample'}(s)"


def row_view(p: Preview, index: int, limit: int | None = None) -> RowView:
    """Train row ``index`` cut into segments and decoded, up to ``limit`` tokens in all."""
    row, tok = p.data.train[index], p.data.tokenizer
    special = special_tokens(tok)
    if not p.data.masked:
        shown = row[:limit] if limit is not None else row
        return RowView(_text_segments(shown, tok, special), len(row) - len(shown))
    left = len(row[0]) + 1 if limit is None else limit
    out, a, hidden = [], 0, 0
    for seg in _segments(row):
        b = a + seg.places
        if seg.kind != "padding":
            ids = row[0, a:b].tolist()
            loss = [False, *(row[1, a : b - 1] != IGNORE_INDEX).tolist()]
            if row[1, b - 1] != IGNORE_INDEX:  # the last token: only a target
                ids.append(int(row[1, b - 1]))
                loss.append(True)
            n = min(left, len(ids))
            seg.tokens = _tokens(tok, ids[:n], loss[:n], special)
            seg.size, seg.loss = len(ids), sum(loss)
            left, hidden = left - n, hidden + len(ids) - n
        out.append(seg)
        a = b
    return RowView(out, hidden)


def _text_segments(row: np.ndarray, tok: AnyTokenizer, special: dict[int, str]) -> list[Segment]:
    ids = row.tolist()
    cuts = [i + 1 for i, t in enumerate(ids) if t == tok.eos_id and i + 1 < len(ids)]
    out = []
    for a, b in zip([0, *cuts], [*cuts, len(ids)], strict=True):
        loss = [i > 0 for i in range(a, b)]
        toks = _tokens(tok, ids[a:b], loss, special)
        out.append(Segment("document", b - a, toks, b - a, sum(loss)))
    return out


def _tokens(
    tok: AnyTokenizer, ids: list[int], loss: list[bool], special: dict[int, str]
) -> list[Token]:
    texts = readable_pieces(tok, ids, special)
    return [Token(t, s, m, t in special) for t, s, m in zip(ids, texts, loss, strict=True)]


def special_tokens(tok: AnyTokenizer) -> dict[int, str]:
    """Id -> text of the tokenizer's special tokens (shown as such, never merged with text)."""
    if isinstance(tok, ByteTokenizer):
        return {} if tok.eos_id is None else {tok.eos_id: "<eos>"}
    if isinstance(tok, FolderTokenizer):
        added = tok.hf.added_tokens_decoder
    else:  # a bare tokenizer.json
        added = tok._tok.get_added_tokens_decoder()
    out = {int(i): str(t.content) for i, t in added.items() if getattr(t, "special", False)}
    for tid in (tok.eos_id, tok.end_id):
        if tid is not None and tid not in out:
            out[tid] = tok.decode([tid]) or "<eos>"
    return out


def readable_pieces(tok: AnyTokenizer, ids: list[int], special: dict[int, str]) -> list[str]:
    """Each token's text, decoded in context: the text that decoding it adds after the few
    tokens before it (SentencePiece keeps its spaces). A character cut across tokens goes to
    the token that completes it (the others get "")."""
    out: list[str] = []
    done = 0  # tokens [0, done) have their text out
    for i, t in enumerate(ids):
        if t in special:
            out.append(special[t])
            done = i + 1
            continue
        lo = max(done - CONTEXT_TOKENS, 0)
        while lo < done and ids[lo] in special:
            lo += 1
        before = tok.decode(ids[lo:done])
        after = tok.decode(ids[lo : i + 1])
        cut_char = after.endswith("\ufffd") and i + 1 < len(ids) and ids[i + 1] not in special
        if cut_char and i + 1 - done < 4:
            out.append("")
            continue
        out.append(
            after[len(before) :] if after.startswith(before) else tok.decode(ids[done : i + 1])
        )
        done = i + 1
    return out


def visible(text: str) -> str:
    """A piece with its line breaks (↵ and a real break), tabs and control characters shown."""
    return "".join(VISIBLE.get(c, chr(0x2400 + ord(c)) if ord(c) < 32 else c) for c in text)
