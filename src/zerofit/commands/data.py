"""`zerofit data preview`: what a run will train on, before launching it.

Builds the data of a config as `zerofit train` does (same tokenizer, rendering, masks, packing and
split; no model, no process), shows the first rows decoded token by token with the loss tokens
marked, counts them, and writes `preview.html` and `lengths.png`.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from zerofit.errors import UserError

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    from zerofit.data.preview import Preview, RowView, Token

LOSS, CONTEXT, SPECIAL, HEAD = (
    "bold green",
    "dim",
    "italic",
    "cyan",
)  # special: + magenta if no loss
OPEN, CLOSE = "[[", "]]"  # loss tokens where there is no colour (a log, a pipe)
HTML_TOKENS = 20_000  # tokens of a row on the page (the terminal shows --tokens)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "data",
        help="look at the training data a config makes",
        description="Tools for the training data a config makes.",
    )
    actions = p.add_subparsers(dest="data_command", required=True, metavar="ACTION")
    pre = actions.add_parser(
        "preview",
        help="show the first packed rows with the loss tokens marked, counts, HTML and histogram",
        description="Build the data exactly as `zerofit train -c CFG` would (tokenizer, chat "
        "template,\nloss masks, packing, train/val split; no model, no GPU, no process), show\n"
        "the first packed training rows decoded token by token with the tokens that carry loss\n"
        "marked ([[...]] when the output is not a terminal), print counts, and write\n"
        "OUT/preview.html and OUT/lengths.png. Config keys are flags, as for `zerofit train`.",
        epilog="examples:\n  zerofit data preview -c sft.yaml\n"
        "  zerofit data preview -c sft.yaml --rows 3 --data.source chats.jsonl --model.seq_len 2048",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    pre.add_argument("-c", "--config", help="YAML config file (default: the embedded defaults)")
    pre.add_argument("--rows", type=int, default=2, help="packed rows to show (default 2)")
    pre.add_argument("--tokens", type=int, default=400, help="tokens to show per row (default 400)")
    pre.add_argument(
        "--out",
        default="data-preview",
        help="folder for preview.html and lengths.png (default ./data-preview)",
    )
    pre.set_defaults(run=run, takes_overrides=True)


def run(args: argparse.Namespace, overrides: list[str]) -> int:
    from rich.console import Console

    from zerofit.data.preview import build_preview, row_view
    from zerofit.data.preview_html import page, write_histogram
    from zerofit.launch.run_config import load_config

    if args.rows < 0 or args.tokens < 1:
        raise UserError("--rows must be >= 0 and --tokens >= 1")
    cfg = load_config(args.config, overrides)
    out = _out_dir(args.out)
    console = Console(highlight=False)
    if console.is_terminal:
        with console.status("building the data as a training run would..."):
            p = build_preview(cfg)
    else:
        p = build_preview(cfg)
    n = min(args.rows, len(p.data.train))
    _header(console, p, args.config, cfg.data.tokenizer)
    for i in range(n):
        _print_row(console, i, len(p.data.train), row_view(p, i, args.tokens), p.data.masked)
    console.print(_counts_table(p))
    title = args.config or "the embedded default config"
    html_file, png_file = out / "preview.html", out / "lengths.png"
    views = [row_view(p, i, HTML_TOKENS) for i in range(n)]
    try:
        html_file.write_text(page(p, views, title), encoding="utf-8")
        write_histogram(p, png_file)
    except OSError as e:
        raise UserError(f"cannot write into --out {out}: {e.strerror or e}") from None
    for path in (html_file, png_file):
        console.print(f"wrote {path}", markup=False, soft_wrap=True)
    return 0


def _out_dir(path: str) -> Path:
    out = Path(path).expanduser()
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"cannot create --out {path}: {e.strerror or e}") from None
    if not out.is_dir():
        raise UserError(f"--out {path} is not a directory")
    return out


def _header(console: Console, p: Preview, config: str | None, tokenizer: str) -> None:
    from rich.text import Text

    d = p.data
    console.print(
        f"data preview of {config or 'the embedded default config'}: "
        f"format {d.label or p.format}, "
        f"tokenizer {tokenizer}, seq_len {d.seq_len}",
        markup=False,
        soft_wrap=True,
    )
    legend = Text("legend: ")
    if p.data.masked and console.color_system is None:
        legend.append(f"{OPEN}loss tokens{CLOSE}, the rest is context; ")
    elif p.data.masked:
        legend.append_text(Text.assemble(("loss tokens", LOSS), ", ", ("context", CONTEXT), ", "))
        legend.append_text(Text.assemble(("special tokens", f"{SPECIAL} magenta"), " (italic); "))
    legend.append(f"↵ is a line break. {p.note()}")
    console.print(legend, soft_wrap=True)


def _print_row(console: Console, index: int, total: int, view: RowView, masked: bool) -> None:
    from rich.text import Text

    parts = [s for s in view.segments if s.kind != "padding"]
    console.rule(f"train row {index + 1} of {total}: {len(parts)} {parts[0].kind}(s)")
    number = 0
    for seg in view.segments:
        number += seg.kind != "padding"
        if seg.tokens or seg.kind == "padding":
            console.print(Text(f"── {seg.head(number)}", style=HEAD))
        if seg.tokens:
            text = _tokens_text(seg.tokens, console.color_system is None, masked)
            console.print(text, soft_wrap=True)
    if view.hidden:
        console.print(Text(f"... {view.hidden} more tokens in this row (see --tokens)", style=HEAD))


def _tokens_text(tokens: list[Token], plain: bool, masked: bool) -> Text:
    """The tokens styled; ``plain``: no colour, runs of loss tokens in [[...]] (a run's closing
    marker goes before its final line break, so the next line starts clean). Not ``masked``
    (text): every token trains, none is marked."""
    from rich.text import Text

    from zerofit.data.preview import visible

    text = Text()
    for i, t in enumerate(tokens):
        piece = visible(t.text)
        loss = t.loss and masked
        opens = plain and loss and (i == 0 or not tokens[i - 1].loss)
        closes = plain and loss and (i + 1 == len(tokens) or not tokens[i + 1].loss)
        style = (LOSS if loss else CONTEXT) if masked else ""
        if t.special:
            style = f"{style} {SPECIAL}" if loss else f"{SPECIAL} magenta"
        if opens:
            text.append(OPEN)
        if closes and piece.endswith("\n"):
            text.append(piece[:-1], style=style)
            text.append(CLOSE + "\n")
        else:
            text.append(piece, style=style)
            text.append(CLOSE if closes else "")
    if text.plain.endswith("\n"):  # print adds the line's own break
        text.right_crop(1)
    return text


def _counts_table(p: Preview) -> Table:
    from rich.table import Table
    from rich.text import Text

    table = Table(title="counts", show_header=False)
    table.add_column("what")
    table.add_column("how many", justify="right")
    for k, v in p.count_lines():
        table.add_row(Text(k), Text(v))
    return table
