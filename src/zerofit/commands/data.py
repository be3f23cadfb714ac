"""`zerofit data preview`: what a run will train on, before launching it.

Builds the data of a config as `zerofit train` does (same tokenizer, rendering, masks, packing and
split; no model, no process), shows the first rows decoded token by token with the loss tokens
marked, counts them, and writes `preview.html` and `lengths.png`.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from zerofit.errors import UserError
from zerofit.launch.run_config import load_config

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
    # torch-free path: `zerofit plan` imports every command module; data.preview imports torch
    from zerofit.data.preview import row_view
    from zerofit.data.preview_html import page, write_histogram  # torch-free path: torch
    from zerofit.data.preview_terminal import show_preview  # torch-free path: torch, rich

    if args.rows < 0 or args.tokens < 1:
        raise UserError("--rows must be >= 0 and --tokens >= 1")
    cfg = load_config(args.config, overrides)
    out = _out_dir(args.out)
    console, p = show_preview(cfg, args.config, args.rows, args.tokens)
    n = min(args.rows, len(p.data.train))
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
