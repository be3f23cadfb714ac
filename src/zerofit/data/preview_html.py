"""``zerofit data preview``'s files: ``preview.html`` (one self-contained page: inline CSS, no
script, no network; every piece of data escaped) and ``lengths.png`` (a histogram of sample
lengths, with the longest sample that fits a row marked)."""

from __future__ import annotations

from html import escape
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from zerofit.data.preview import Preview, RowView, Segment, Token, visible

CSS = """
body { font-family: system-ui, sans-serif; margin: 2em; color: #222; max-width: 80em; }
table { border-collapse: collapse; margin: 1em 0; }
td { border-bottom: 1px solid #ddd; padding: 0.25em 1em 0.25em 0; vertical-align: top; }
td:first-child { color: #555; }
.legend span { padding: 0 0.3em; }
.row { margin: 1.5em 0; }
.row h2 { font-size: 1.05em; margin: 0 0 0.4em 0; }
.seg { border-left: 3px solid #9ab; margin: 0.3em 0; padding: 0.2em 0.6em; }
.seg .head { font-size: 0.8em; color: #678; }
.seg.padding { border-left-color: #ccc; color: #999; font-size: 0.8em; }
.toks { font-family: ui-monospace, monospace; white-space: pre-wrap; word-break: break-all;
        line-height: 1.5; }
.t { color: #888; }
.t:nth-child(even) { background: #f3f3f3; }
.t.loss { color: #0a5d1e; background: #d6f5dc; font-weight: 600; }
.t.loss:nth-child(even) { background: #c2edca; }
.t.sp { color: #8a2be2; font-style: italic; }
.t.loss.sp { color: #6a0dad; }
.more { color: #a60; font-style: italic; }
"""


def _token(t: Token) -> str:
    cls = "t" + (" loss" if t.loss else "") + (" sp" if t.special else "")
    label = "loss" if t.loss else "context"
    return f'<span class="{cls}" title="id {t.id} ({label})">{escape(visible(t.text))}</span>'


def _segment(seg: Segment, number: int) -> str:
    if seg.kind == "padding":
        return f'<div class="seg padding">{seg.head(number)}</div>'
    head = seg.head(number)
    toks = "".join(_token(t) for t in seg.tokens)
    return f'<div class="seg"><div class="head">{head}</div><div class="toks">{toks}</div></div>'


def _row(index: int, total: int, view: RowView) -> str:
    parts = [f"<h2>train row {index + 1} of {total}: {view.title()}</h2>"]
    parts += [_segment(s, i + 1) for i, s in enumerate(view.segments)]
    if view.hidden:
        parts.append(f'<div class="more">... {view.hidden} more tokens in this row</div>')
    return '<div class="row">' + "".join(parts) + "</div>"


def page(p: Preview, views: list[RowView], title: str) -> str:
    """The whole page; ``title`` (e.g. the config's path) is escaped like the data."""
    counts = "".join(
        f"<tr><td>{escape(k)}</td><td>{escape(v)}</td></tr>" for k, v in p.count_lines()
    )
    legend = (
        '<p class="legend toks"><span class="t loss">loss token</span> '
        '<span class="t">context (no loss)</span> <span class="t sp">special token</span> '
        f"&mdash; {escape(p.note())}</p>"
    )
    rows = "".join(_row(i, len(p.data.train), v) for i, v in enumerate(views))
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>zerofit data preview: {escape(title)}</title><style>{CSS}</style></head>"
        f"<body><h1>zerofit data preview</h1><p>{escape(title)}</p>"
        f"<table>{counts}</table>{legend}{rows}</body></html>\n"
    )


def write_histogram(p: Preview, path: Path) -> None:
    """Sample (pair) lengths in tokens, the longest that fits a row (seq_len + 1; a pair's two
    documents: seq_len + 2) marked."""
    fig = Figure(figsize=(8, 4.5), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    unit = p.unit
    lengths = p.lengths or [0]
    ax.hist(lengths, bins=min(60, max(1, len(set(lengths)))), color="#4a90c2")
    limit, extra = p.fits, p.fits - p.seq_len
    ax.axvline(
        limit, color="#c0392b", linestyle="--", label=f"seq_len + {extra} = {limit:,} (fits a row)"
    )
    over = sum(n > limit for n in p.lengths)
    ax.set_title(
        f"{len(p.lengths):,} {unit}, {sum(p.lengths):,} tokens; {over:,} longer than a row",
        fontsize=11,
    )
    ax.set_xlabel(f"{unit[:-1]} length (tokens)")
    ax.set_ylabel(unit)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, format="png")
