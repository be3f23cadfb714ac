"""tools/planner_residuals.py: every committed GPU run forecast again, with and without the
planner's host term, the fit set named. CPU only (the runs are read from docs/benchmarks/data/)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

import planner_residuals as pr  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def fixture_models() -> Iterator[None]:
    """The fine-tuning runs name bench-fixture's models: their configs, built here if absent."""
    with pr.fixture_models():
        yield


@pytest.fixture(scope="module")
def runs() -> list[pr.Run]:
    return pr.corpus()[0]


@pytest.fixture(scope="module")
def rows(runs: list[pr.Run]) -> list[pr.Row]:
    return [pr.row(r) for r in runs]


def test_the_corpus_holds_both_cards_and_the_named_fit_set(rows: list[pr.Row]) -> None:
    assert len(rows) >= 100
    assert {x.run.hw.name for x in rows} == {"H200", "H100 SXM"}
    fit = [x for x in rows if x.group == "fit"]
    assert len(fit) == 8 and all(x.run.key.startswith(pr.FIT_SET) for x in fit)
    keys = [(x.run.key.split(":", 1)[1], round(x.run.step_s, 6)) for x in rows]
    assert len(keys) == len(set(keys))  # a bundle's copy of a results file is counted once


# The held-out runs the host term moves away from their measurement (issue 27, open): the
# 2026-12-06 FSDP2 eager run without recomputation on the H100 machine's host, host-bound at 2,048
# tokens a micro-batch (measured 0.237 s a step; the term says 0.514 s of host work, from FSDP2
# hooks costed on the H200 machine's host: docs/benchmarks/2026-12-06-planner-heldout-h100.md).
MOVES_AWAY = {
    "2026-12-06-planner-heldout-h100/all-results.json:fsdp eager 2x2",
    # the third host-probe call's DeepSpeed offloaded step, timed whole at one size (24.8 GB/s,
    # its fixed cost counted as streaming): +38.9% against the fitted rate's +17.9%; the probe
    # has since taken the difference of two sizes (docs/benchmarks/2026-12-06-host-probe-h100-2.md)
    "2026-12-06-host-probe-h100-3/all-results.json:zero3 optim cpu eager 1x1024 x2",
    # the fourth call's ZeRO-3 + CPU optimizer in bf16 states, within 10% either way: -0.6% with
    # the roofline, +2.7% with the probed two-size step rate (27.2 GB/s)
    "2026-12-06-host-probe-h100-4/all-results.json:zero3 optim cpu bf16 eager 2x1",
    # the fifth call's FSDP2 CPU offload: its probe timed AdamW without the clipping a run's host
    # step also does (106-156 GB/s): -37.9%, against the fitted rate's +7.6%; the probe has
    # since timed both (docs/benchmarks/2026-12-07-host-probe-h100-5.md)
    "2026-12-07-host-probe-h100-5/all-results.json:fsdp cpu offload eager 2x1",
    # the seventh call's (docs/benchmarks/2026-12-07-host-probe-h100-7.md), with the probed
    # PCIe rate (53.3 GB/s): FSDP2 offload at 1 x 1024 x 2, -1.5% -> -4.2%, still within 5%;
    # ZeRO-3 + CPU optimizer at 1 x 2048, -11.4% -> -23.1%: under-forecast, not yet explained
    "2026-12-07-host-probe-h100-7/all-results.json:fsdp cpu offload eager 1x1024 x2",
    "2026-12-07-host-probe-h100-7/all-results.json:zero3 optim cpu eager 1x1",
}


def test_no_run_held_out_of_the_fit_moves_away_from_what_it_measured(rows: list[pr.Row]) -> None:
    """The host term only adds time, and only where the host is the longer: every held-out run
    it changes comes closer to its measurement (the 2026-12-03 eager rows most), but for the
    known misses in MOVES_AWAY, which still move away (a fix fails this until the set is cut)."""
    held = [x for x in rows if x.group != "fit"]
    changed = [x for x in held if abs(x.after - x.before) > 1e-9]
    assert len(changed) >= 20
    away = {x.run.key for x in changed if abs(x.after) >= abs(x.before)}
    assert away == MOVES_AWAY


def test_the_fit_set_within_10_percent_in_6_of_8(rows: list[pr.Row]) -> None:
    fit = [x for x in rows if x.group == "fit"]
    assert sum(abs(x.before) <= pr.BOUND for x in fit) == 3  # the roofline alone
    assert sum(abs(x.after) <= pr.BOUND for x in fit) == 6


def test_the_constants_in_use_are_the_fit(runs: list[pr.Run]) -> None:
    """What `--fit` finds on FIT_SET is what the planner uses (a coarse grid here: the fit's own
    1 us / 5 us grid takes ~30 s)."""
    runs = [r for r in runs if r.key.startswith(pr.FIT_SET)]
    best = pr.loss(runs)
    for launch, hook, passes in [(25e-6, 170e-6, 2), (33e-6, 170e-6, 2), (29e-6, 150e-6, 2)]:
        with pr.constants(launch, hook, passes):
            assert pr.loss(runs) > best
    for passes in (1, 3):
        with pr.constants(pr.speed.LAUNCH_SECONDS, pr.speed.HOOK_SECONDS, passes):
            assert pr.loss(runs) > best
