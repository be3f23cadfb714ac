"""`zerofit doctor` on real runs, and the OOM diagnosis."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from zerofit.cli import main
from zerofit.launch.run_config import load_config
from zerofit.report.doctor import diagnose, oom_advice

pytestmark = pytest.mark.dist


@pytest.fixture(scope="module")
def runs(shared_run) -> dict[str, Path]:  # noqa: ANN001
    return {
        "sharded": shared_run("fsdp@2"),
        # FSDP asked for, but replicate_degree = world size: every rank holds the whole model
        "unsharded": shared_run("fsdp-hybrid@2"),
    }


@pytest.mark.slow
def test_doctor_catches_parameters_that_are_not_sharded(runs: dict[str, Path], capsys) -> None:
    findings = {f.check: f for f in diagnose(runs["unsharded"])}
    assert findings["sharding"].status == "FAIL"
    assert (
        "NOT sharded" in findings["sharding"].message
        and "replicate_degree=2" in findings["sharding"].message
    )
    assert main(["doctor", str(runs["unsharded"])]) == 1


@pytest.mark.slow
def test_doctor_passes_a_sharded_run(runs: dict[str, Path], capsys) -> None:
    findings = {f.check: f for f in diagnose(runs["sharded"])}
    assert findings["sharding"].status == "ok" and "50.0%" in findings["sharding"].message
    assert findings["precision"].status == "ok" and findings["batch"].status == "ok"
    assert main(["doctor", str(runs["sharded"])]) == 0


def test_oom_advice_names_the_biggest_component_and_a_fix(tmp_path: Path) -> None:
    cfg_file = tmp_path / "c.yaml"
    cfg_file.write_text(
        "model: {preset: llama3-8b, seq_len: 4096}\ntrain: {micro_batch_size: 4}\nprecision: {mode: bf16}\n"
    )
    advice = oom_advice(load_config(cfg_file), world=8, gpu_mem=80 * 10**9)
    assert advice.startswith("biggest component: activations")
    assert "next step: turn on activation checkpointing" in advice


def test_oom_advice_under_first_k_recomputes_the_fewest_more_blocks() -> None:
    """A first_k run that ran out of memory: the advice raises ac_blocks to the fewest that fit
    (the same rule as for the other remedies), or goes to full checkpointing."""
    base = [
        "model.preset=llama3-8b",
        "model.seq_len=4096",
        "train.micro_batch_size=4",
        "precision.mode=bf16",
        "parallel.activation_checkpointing=first_k",
    ]
    advice = oom_advice(load_config(None, [*base, "parallel.ac_blocks=1"]), 8, 80 * 10**9)
    found = re.search(
        r"next step: recompute the first (\d+) blocks \(parallel.ac_blocks: \d+\)", advice
    )
    assert found, advice
    k = int(found.group(1))
    assert 1 < k < 32
    fewer = oom_advice(load_config(None, [*base, f"parallel.ac_blocks={k - 1}"]), 8, 80 * 10**9)
    assert f"recompute the first {k} blocks" in fewer  # k - 1 does not fit, k does
    tight = oom_advice(load_config(None, [*base, "parallel.ac_blocks=31"]), 8, 40 * 10**9)
    assert "recompute the first" not in tight, tight


def test_doctor_rejects_a_non_run(tmp_path: Path, capsys) -> None:
    assert main(["doctor", str(tmp_path)]) == 2
    assert "not a zerofit run directory" in capsys.readouterr().err


def test_a_compiled_block_failing_under_ac_is_one_line_with_the_remedy() -> None:
    """torch 2.11's SystemError for a compiled region inside AC (ZeRO-3 + AC + compile on the
    H200, 2026-12-03) becomes one line naming both ways out; anything else stays itself."""
    from zerofit.launch.run_config import load_config
    from zerofit.report.run_files import compiled_ac_failure

    error = SystemError(
        "<built-in method apply of FunctionMeta object at 0x56881fd0> returned NULL without "
        "setting an exception"
    )
    both = ["parallel.compile=true", "parallel.activation_checkpointing=full"]
    line = compiled_ac_failure(load_config(None, both), error)
    assert line is not None and len(line.splitlines()) == 1
    assert "pytorch/pytorch#179536" in line and "parallel.compile: false" in line
    assert "parallel.activation_checkpointing: none" in line
    assert compiled_ac_failure(load_config(None, both[:1]), error) is None  # no AC
    assert compiled_ac_failure(load_config(None, both[1:]), error) is None  # not compiled
    assert compiled_ac_failure(load_config(None, both), SystemError("other")) is None


def _report(console) -> list[str]:  # noqa: ANN001
    from zerofit.report.doctor import Finding, print_report

    long = (
        "rank 0 holds 100% of the parameters; " + "an FSDP2 run of 8 ranks should hold 12.5%. " * 4
    )
    findings = [Finding("sharding", "FAIL", long), Finding("speed", "ok", "[x] within 3%")]
    assert print_report(findings, console) == 1
    return console.file.getvalue().splitlines()


@pytest.mark.parametrize("width", [60, 100, 200])
def test_the_doctor_report_fits_100_columns_on_a_terminal_and_wraps_under_the_message(
    width: int,
) -> None:
    import io

    from rich.console import Console

    console = Console(file=io.StringIO(), force_terminal=True, width=width, color_system=None)
    lines = _report(console)
    assert max(map(len, lines)) <= max(100, width)
    assert lines[0].startswith(" FAIL sharding")
    assert "[x] within 3%" in "\n".join(lines)  # a message is text, not markup
    if width <= 100:  # wrapped lines start under the message, not under the status
        assert lines[1].startswith(" " * 19) and len(lines) > 2


def test_a_piped_doctor_report_is_one_whole_line_a_finding() -> None:
    import io

    from rich.console import Console

    lines = _report(Console(file=io.StringIO()))
    assert len(lines) == 2 and lines[0].startswith("FAIL  sharding") and len(lines[0]) > 160
    assert lines[1].endswith("[x] within 3%")
