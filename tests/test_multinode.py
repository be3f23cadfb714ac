"""The two-node path on one host: two `zerofit train --nnodes 2` node groups with a local
rendezvous, hybrid sharding across the "nodes" (replicate 2 x shard 1), sharing one run directory.
It trains and matches the single-group run with the same mesh."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import deep_update, losses, shared_extra, write_config

pytestmark = [pytest.mark.dist, pytest.mark.slow]

# replicate 2 x shard 1: conftest's shared run of this layout is the single-group reference.
HYBRID = "fsdp-hybrid@2"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_node_groups_match_one_group(tmp_path: Path, shared_run) -> None:  # noqa: ANN001
    single = shared_run(HYBRID)
    run_dir = tmp_path / "two_nodes"
    cfg = write_config(
        tmp_path / "two.yaml", deep_update(shared_extra(HYBRID), {"log": {"run_dir": str(run_dir)}})
    )
    port = _free_port()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env["PYTHONPATH"] = (
        str(Path(__file__).resolve().parents[1] / "src") + os.pathsep + env.get("PYTHONPATH", "")
    )
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "zerofit.cli",
                "train",
                "-c",
                str(cfg),
                "--nproc",
                "1",
                "--nnodes",
                "2",
                "--node-rank",
                str(rank),
                "--rdzv-endpoint",
                f"127.0.0.1:{port}",
            ],
            cwd=tmp_path,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )  # fmt: skip
        for rank in (0, 1)
    ]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], "\n".join(o[-3000:] for o in outs)
    got, want = losses(run_dir), losses(single)
    assert sorted(got) == sorted(want) == list(range(1, 11))
    for step in want:
        assert abs(got[step] - want[step]) <= 1e-5 * abs(want[step]), (step, got[step], want[step])
    import json

    for rank in (0, 1):  # 2 replicas x 1 shard: each node holds the whole model
        rep = json.loads((run_dir / "sharding" / f"rank{rank}.json").read_text())
        assert rep["world_size"] == 2 and rep["local_numel"] == rep["global_numel"]
    assert (run_dir / "config.yaml").is_file() and sorted(
        p.name for p in (run_dir / "sharding").iterdir()
    ) == [
        "rank0.json",
        "rank1.json",
    ]
