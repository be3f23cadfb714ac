"""Entry point of one training process (started by torch.distributed.run from `zerofit train`)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from zerofit.config import load_config
from zerofit.errors import UserError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="zerofit.worker")
    parser.add_argument("--config", required=True)
    parser.add_argument("--run-dir", required=True)
    parser.add_argument("--resume", default=None)
    parser.add_argument("--error-dir", default=None, help="write input errors here, per rank")
    args = parser.parse_args(argv)
    from zerofit.dist import shutdown
    from zerofit.trainer import run_training

    code = 0
    rank = int(os.environ.get("RANK", 0))
    try:
        cfg = load_config(args.config)
        run_training(cfg, Path(args.run_dir), Path(args.resume) if args.resume else None)
    except UserError as e:
        if args.error_dir:  # the launcher prints one line for all ranks
            Path(args.error_dir, f"rank{rank}.txt").write_text(str(e))
        else:
            print(f"error: {e}" if rank == 0 else f"error (rank {rank}): {e}", file=sys.stderr)
        code = 2
    except Exception:
        # A rank that lost its peers because one of them stopped on an input error: that error
        # is the one to report (the launcher prints it), not this consequence of it.
        if not (args.error_dir and any(Path(args.error_dir).glob("rank*.txt"))):
            raise
        code = 2
    finally:
        shutdown()
    return code


if __name__ == "__main__":
    exit_code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # Everything is written and the process group is destroyed. Skip interpreter teardown: with
    # gloo and CPU offload, C++ worker threads destroyed at exit have aborted the process (SIGABRT,
    # "terminate called without an active exception") after a complete run.
    os._exit(exit_code)
