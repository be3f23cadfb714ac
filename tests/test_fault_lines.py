"""The launcher's one line: which rank's outcome is the root cause, and how each is worded."""

from __future__ import annotations

import errno
import signal

import pytest
import torch

from zerofit.errors import RunStopped
from zerofit.faults.nonfinite import NonFinitePolicy, StepResult
from zerofit.faults.report import Record, death_line, describe_os_error, launcher_line
from zerofit.faults.signals import StopSignals
from zerofit.faults.step_gate import StepGate, describe

HINT = "The last checkpoint is X"


def rec(rank: int, kind: str, line: str, code: int = 1) -> Record:
    return Record(rank, kind, code, line)


def test_a_killed_rank_outranks_the_peers_it_left_behind() -> None:
    records = {0: rec(0, "peer", "RuntimeError: Connection closed by peer")}
    line, code = launcher_line(records, {0: 1, 1: -signal.SIGKILL}, HINT)
    assert line.startswith("rank 1 was killed by SIGKILL: likely the host's out-of-memory killer")
    assert "GiB of RAM" in line and line.endswith(HINT) and code == 1


def test_input_errors_then_nonfinite_then_io_then_crashes() -> None:
    records = {
        0: rec(0, "crash", "rank 0 failed: ValueError"),
        1: rec(1, "io", "I/O error: No space left on device (ENOSPC)", 4),
    }
    assert launcher_line(records, {0: 1, 1: 4}, HINT) == (records[1].line, 4)
    records[2] = rec(2, "nonfinite", "stopped at step 3: the loss is nan", 3)
    assert launcher_line(records, {0: 1, 1: 4, 2: 3}, HINT)[1] == 3
    records[3] = rec(3, "user", "bad input", 2)
    assert launcher_line(records, {}, HINT) == ("bad input", 2)


def test_one_message_shared_by_every_rank_is_printed_once() -> None:
    same = {r: rec(r, "nonfinite", "stopped at step 2", 3) for r in range(4)}
    assert launcher_line(same, {}, HINT) == ("stopped at step 2", 3)
    same[2] = rec(2, "nonfinite", "different", 3)
    assert launcher_line(same, {}, HINT)[0] == "(rank 0) stopped at step 2"


def test_a_silent_exit_status_and_native_crashes_are_named() -> None:
    assert launcher_line({}, {3: 7}, HINT)[0].startswith("rank 3 exited with status 7")
    assert "native code" in death_line(0, -signal.SIGSEGV)
    # SIGTERM is how the agent tears the group down after another failure: not a cause.
    line, _ = launcher_line({1: rec(1, "crash", "rank 1 failed: KeyError")}, {0: -15, 1: 1}, HINT)
    assert line.startswith("rank 1 failed: KeyError")


def test_os_errors_are_found_inside_dcp_exceptions() -> None:
    from torch.distributed.checkpoint.api import CheckpointException

    inner = OSError(errno.ENOSPC, "No space left on device", "/ck/step_2.tmp/__0_0.distcp")
    wrapped = CheckpointException(
        "save failed", {0: (RuntimeError("unexpected pos"), []), 1: (inner, [])}
    )
    assert describe_os_error(wrapped) == (
        "No space left on device (ENOSPC) writing /ck/step_2.tmp/__0_0.distcp"
    )
    assert describe_os_error(RuntimeError("x" * 500)).startswith("RuntimeError: xxx")
    assert len(describe_os_error(RuntimeError("x" * 500))) < 250


def test_the_policy_counts_skips_and_stops() -> None:
    bad, good = StepResult(None, applied=False), StepResult(None)
    stop = NonFinitePolicy("stop", 10)
    with pytest.raises(RunStopped) as e:
        stop.record(7, bad, "the loss is nan", "no checkpoint was saved")
    assert e.value.code == 3 and str(e.value).startswith("stopped at step 7: the loss is nan")
    skip = NonFinitePolicy("skip", 2)
    for step in (1, 2):
        skip.record(step, bad, "x", "")
    skip.record(3, good, "", "")  # a good step resets the run of skips
    skip.record(4, bad, "x", "")
    skip.record(5, bad, "x", "")
    with pytest.raises(RunStopped, match="3 non-finite steps in a row"):
        skip.record(6, bad, "x", "")
    assert skip.skipped == 5
    scaler = NonFinitePolicy("stop", 1)
    scaler.record(1, StepResult(None, applied=False, scale_skip=True), "", "")  # not an error
    assert scaler.scale_skips == 1 and scaler.skipped == 0


def test_the_gate_checks_on_device_and_names_the_culprit() -> None:
    gate = StepGate(StopSignals(), world_size=1)
    assert gate(torch.tensor([2.5, 1.0]))
    assert not gate(torch.tensor([float("nan"), float("inf")]))
    assert describe(gate.evidence) == "the loss is nan, the gradient norm is inf"
    assert gate.signum == 0
