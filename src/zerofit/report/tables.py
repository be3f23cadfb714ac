"""The tables zerofit prints (bench results and profiles, the run summary, the data preview's
counts), sized for where they go. Not a terminal (a pipe, a log, a file): markdown, every value in
full and no line cut, whatever its length. A terminal: a rich table at most ``max(MIN_COLUMNS,
the terminal's width)`` wide, its cells wrapped (folded, never cut off) and, when it still does
not fit, its columns without a value dropped."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

from rich import box
from rich.console import Console, ConsoleOptions, RenderableType, RenderResult
from rich.table import Table
from rich.text import Text

MIN_COLUMNS = 100  # a table on a terminal may use this many columns, or the terminal's width
EMPTY = ("", "-")  # cells that hold no value
BORDER = 3  # columns rich's default table spends per column on its rules and padding, plus one
COMPACT_GAP = 2  # columns between two columns of the compact table (no rules, no edge padding)
LEFT_FLOOR = 8  # a left-aligned column (names, paths) wraps down to this width before all else

Align = Literal["left", "right"]


@dataclass
class TextTable:
    """A table of strings: what a printed table and a markdown one are both built from."""

    title: str
    headers: list[str]
    align: list[Align] = field(default_factory=list)  # per column; default: left
    rows: list[list[str]] = field(default_factory=list)
    styles: list[str | None] = field(default_factory=list)  # per row, on a terminal only
    show_header: bool = True  # on a terminal; markdown always has its header row
    short: list[str] = field(default_factory=list)  # headers for a terminal too narrow for them

    def add_row(self, cells: list[str], style: str | None = None) -> None:
        if len(cells) != len(self.headers):
            raise ValueError(f"{len(cells)} cells for {len(self.headers)} columns")
        self.rows.append(list(cells))
        self.styles.append(style)

    def alignment(self, index: int) -> Align:
        return self.align[index] if index < len(self.align) else "left"

    def markdown(self) -> list[str]:
        """The header row, the alignment row and a row per row: cells in full, '|' escaped."""
        rule = ["---:" if self.alignment(i) == "right" else "---" for i in range(len(self.headers))]
        lines = ["| " + " | ".join(map(markdown_cell, self.headers)) + " |"]
        lines.append("|" + "|".join(rule) + "|")
        lines += ["| " + " | ".join(map(markdown_cell, row)) + " |" for row in self.rows]
        return lines

    def texts(self, i: int, compact: bool = False) -> list[str]:
        """Column ``i``'s texts: its header where it is shown, and its cells."""
        head = self.short[i] if compact and self.short else self.headers[i]
        return ([head] if self.show_header else []) + [row[i] for row in self.rows]

    def natural_width(self, columns: list[int]) -> int:
        """Columns rich's default table of these takes, no cell wrapped."""
        return sum(longest(self.texts(i)) for i in columns) + BORDER * len(columns) + 1

    def rich(self, width: int | None = None) -> Table:
        """A rich table (cells are text, not markup). Given a ``width``, it fits: as it is if it
        can, else in a compact style with the short headers and without the columns that hold no
        value, its cells wrapped (numbers kept whole while they can be)."""
        columns = list(range(len(self.headers)))
        if width is None or self.natural_width(columns) <= width:
            return self.rich_table(columns, [None] * len(columns), compact=False)
        columns = [i for i in columns if i == 0 or any(r[i] not in EMPTY for r in self.rows)]
        widths = self.fitted_widths(columns, width - COMPACT_GAP * (len(columns) - 1))
        return self.rich_table(columns, list(widths), compact=True)

    def rich_table(self, columns: list[int], widths: list[int | None], compact: bool) -> Table:
        style: dict[str, Any] = {}
        if compact:
            style = {"box": box.SIMPLE_HEAD, "collapse_padding": True, "pad_edge": False}
            style["show_edge"] = False
        table = Table(title=self.title, show_header=self.show_header, **style)
        for i, w in zip(columns, widths, strict=True):
            head = self.texts(i, compact)[0] if self.show_header else self.headers[i]
            table.add_column(head, justify=self.alignment(i), overflow="fold", width=w)
        for row, row_style in zip(self.rows, self.styles, strict=True):
            table.add_row(*(Text(row[i]) for i in columns), style=row_style)
        return table

    def fitted_widths(self, columns: list[int], budget: int) -> list[int]:
        """Widths of ``columns`` summing to at most ``budget``: first each right-aligned column's
        longest cell (a number is not split) and up to LEFT_FLOOR of a left-aligned one's, then
        whole words, then whole cells, shared out to the columns that need least first."""
        texts = [self.texts(i, compact=True) for i in columns]
        floor = [
            longest(row[i] for row in self.rows)
            if self.alignment(i) == "right"
            else min(longest(t), LEFT_FLOOR)
            for i, t in zip(columns, texts, strict=True)
        ]
        if sum(floor) > budget:  # too many columns even so: each shrinks, its cells fold
            return [max(1, f * budget // sum(floor)) for f in floor]
        words = [longest(w for t in ts for w in t.split()) for ts in texts]
        widths = share_out(floor, words, budget)
        return share_out(widths, [longest(t) for t in texts], budget)

    def __rich__(self) -> Table:
        return self.rich()


def longest(texts: Iterable[str]) -> int:
    return max((len(t) for t in texts), default=0)


def share_out(widths: list[int], targets: list[int], budget: int) -> list[int]:
    """``widths`` raised towards ``targets`` within ``budget`` in all, the columns that need
    least filled first (each then takes at most an even share of what is left)."""
    widths = list(widths)
    needy = sorted(
        (i for i, w in enumerate(widths) if w < targets[i]), key=lambda i: targets[i] - widths[i]
    )
    for k, i in enumerate(needy):
        spare = budget - sum(widths)
        if spare <= 0:
            break
        widths[i] += min(targets[i] - widths[i], spare // (len(needy) - k) or spare)
    return widths


def markdown_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def table_width(console: Console) -> int | None:
    """Columns a table printed on ``console`` may take: None (no limit) when it is not a
    terminal, else the terminal's width or MIN_COLUMNS, whichever is larger."""
    return max(MIN_COLUMNS, console.width) if console.is_terminal else None


@dataclass
class Widened:
    """A renderable laid out ``width`` columns wide, whatever the console's own width."""

    renderable: RenderableType
    width: int

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield from console.render(self.renderable, options.update_width(self.width))


def print_table(table: TextTable, console: Console) -> None:
    """``table`` on ``console``: markdown under its title where it is not a terminal, else a rich
    table fitted to ``table_width``."""
    width = table_width(console)
    if width is None:
        lines = [table.title, "", *table.markdown(), ""] if table.title else table.markdown()
        print_lines(console, lines)
        return
    console.print(Widened(table.rich(width), width), crop=False)


def print_lines(console: Console, lines: list[str], style: str | None = None) -> None:
    """Each line as text (not markup): whole where ``console`` is not a terminal, else wrapped
    at ``table_width``."""
    width = table_width(console)
    for line in lines:
        text = Text(line, style=style or "")
        if width is None:
            console.print(text, soft_wrap=True)
        else:
            console.print(Widened(text, width), crop=False)
