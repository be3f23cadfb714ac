"""``zerofit data preview`` on the terminal: the first packed rows decoded token by token, the loss
tokens marked (in colour, or ``[[...]]`` where there is none: a log, a pipe), and the counts."""

from __future__ import annotations

from rich.console import Console
from rich.text import Text

from zerofit.config.schema import Config
from zerofit.data.preview import Preview, RowView, Token, build_preview, row_view, visible
from zerofit.report.tables import TextTable, print_table

LOSS, CONTEXT, SPECIAL, HEAD = (
    "bold green",
    "dim",
    "italic",
    "cyan",
)  # special: + magenta if no loss
OPEN, CLOSE = "[[", "]]"  # loss tokens where there is no colour (a log, a pipe)


def show_preview(
    cfg: Config, config: str | None, rows: int, tokens: int
) -> tuple[Console, Preview]:
    """Build the data of ``cfg`` (a spinner on a terminal), print its first ``rows`` rows (up to
    ``tokens`` tokens each) and the counts; returns the console and the preview."""
    console = Console(highlight=False)
    if console.is_terminal:
        with console.status("building the data as a training run would..."):
            p = build_preview(cfg)
    else:
        p = build_preview(cfg)
    header(console, p, config, cfg.data.tokenizer)
    for i in range(min(rows, len(p.data.train))):
        print_row(console, i, len(p.data.train), row_view(p, i, tokens), p.data.masked)
    print_table(counts_table(p), console)  # markdown where it is not a terminal
    return console, p


def header(console: Console, p: Preview, config: str | None, tokenizer: str) -> None:
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


def print_row(console: Console, index: int, total: int, view: RowView, masked: bool) -> None:
    console.rule(f"train row {index + 1} of {total}: {view.title()}")
    number = 0
    for seg in view.segments:
        number += seg.kind != "padding"
        if seg.tokens or seg.kind == "padding":
            console.print(Text(f"── {seg.head(number)}", style=HEAD))
        if seg.tokens:
            text = tokens_text(seg.tokens, console.color_system is None, masked)
            console.print(text, soft_wrap=True)
    if view.hidden:
        console.print(Text(f"... {view.hidden} more tokens in this row (see --tokens)", style=HEAD))


def tokens_text(tokens: list[Token], plain: bool, masked: bool) -> Text:
    """The tokens styled; ``plain``: no colour, runs of loss tokens in [[...]] (a run's closing
    marker goes before its final line break, so the next line starts clean). Not ``masked``
    (text): every token trains, none is marked."""
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


def counts_table(p: Preview) -> TextTable:
    table = TextTable("counts", ["what", "how many"], ["left", "right"], show_header=False)
    for k, v in p.count_lines():
        table.add_row([k, v])
    return table
