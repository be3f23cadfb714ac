"""`zerofit` command line. Every config key is also a flag: `--train.steps 100`.

Each subcommand lives in `zerofit.commands.<name>` and owns its arguments; this module builds the
parser from them, turns the remaining `--section.key VALUE` flags into overrides (for the commands
that set `takes_overrides`; the others refuse them) and every `UserError` into one line and exit
status 2.
"""

from __future__ import annotations

import argparse
import gc
import signal
import sys
import threading

from zerofit import __version__
from zerofit.commands import modules
from zerofit.config.limits import shown
from zerofit.errors import UserError


def split_overrides(rest: list[str]) -> list[str]:
    """['--train.steps', '100', '--optim.lr=3e-4'] -> ['train.steps=100', 'optim.lr=3e-4'].

    Each `--section.key` names a field under a section; whether the config file has a mapping
    there is checked when they are merged (`zerofit.config.load_config`)."""
    out, i = [], 0
    while i < len(rest):
        tok = rest[i]
        if not tok.startswith("--") or "." not in tok.split("=", 1)[0]:
            raise UserError(
                f"unrecognized argument {shown(tok)} (config overrides look like --train.steps 100)"
            )
        if "=" in tok:
            out.append(tok[2:])
            i += 1
        else:
            if i + 1 >= len(rest):
                raise UserError(f"{shown(tok)} needs a value")
            out.append(f"{tok[2:]}={rest[i + 1]}")
            i += 2
    return out


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="zerofit",
        description="Train LLMs with FSDP2, DeepSpeed ZeRO or DDP behind one config.",
    )
    parser.add_argument("--version", action="version", version=f"zerofit {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for module in modules():
        module.register(sub)
    return parser


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(signum)


def main(argv: list[str] | None = None) -> int:
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _interrupt)  # until workers start and take over
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    args.argv = list(argv if argv is not None else sys.argv[1:])
    try:
        overrides = split_overrides(rest)
        if overrides and not getattr(args, "takes_overrides", False):
            raise UserError(f"unrecognized arguments: {' '.join(rest)}")
        return args.run(args, overrides)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:  # before any worker started (they handle their own signals)
        signum = e.args[0] if e.args and isinstance(e.args[0], int) else signal.SIGINT
        print(
            f"stopped by {signal.Signals(signum).name} before training started; nothing was lost",
            file=sys.stderr,
        )
        return 128 + signum


def entry() -> None:
    """The `zerofit` command (and `python -m zerofit.cli`): main(), then the exit status."""
    code = main()
    # Interpreter teardown would walk every object torch created (~0.3 s of each command that
    # imported it); frozen, they are left to the OS. Files, atexit handlers and threads are
    # finished as usual.
    gc.freeze()
    sys.exit(code)


if __name__ == "__main__":
    entry()
