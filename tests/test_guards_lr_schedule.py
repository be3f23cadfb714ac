"""The learning-rate schedule (`zerofit.train.lr_schedule.lr_at`) at its joints: the warmup's
last step reaches the peak, the first decay step is the peak, the end is lr x min_lr_ratio and
stays there, and a schedule with no decay steps ends at once."""

from __future__ import annotations

import math

import pytest

from zerofit.train.lr_schedule import lr_at

KW = {"lr": 2.0, "warmup_steps": 4, "total_steps": 14, "min_lr_ratio": 0.25}


def test_warmup_is_linear_up_to_the_peak() -> None:
    assert [lr_at(s, **KW) for s in range(4)] == [0.5, 1.0, 1.5, 2.0]


def test_the_first_step_after_warmup_is_the_peak() -> None:
    assert lr_at(4, **KW) == 2.0


def test_cosine_from_the_peak_to_the_floor() -> None:
    # 10 decay steps: step 4 + k has progress k / 10
    for k in range(11):
        cos = 0.5 * (1 + math.cos(math.pi * k / 10))
        assert lr_at(4 + k, **KW) == pytest.approx(2.0 * (0.25 + 0.75 * cos), abs=1e-12)
    assert lr_at(9, **KW) == pytest.approx(2.0 * (0.25 + 0.75 * 0.5))
    values = [lr_at(s, **KW) for s in range(4, 15)]
    assert values == sorted(values, reverse=True)


@pytest.mark.parametrize("step", [14, 15, 100, 10**6])
def test_the_floor_holds_after_the_end(step: int) -> None:
    assert lr_at(step, **KW) == pytest.approx(0.5, abs=1e-12)


def test_no_warmup_starts_at_the_peak() -> None:
    kw = {**KW, "warmup_steps": 0}
    assert lr_at(0, **kw) == 2.0
    assert lr_at(14, **kw) == pytest.approx(0.5)
    assert lr_at(7, **kw) == pytest.approx(2.0 * (0.25 + 0.75 * 0.5))


def test_no_decay_steps_ends_at_the_floor_one_step_after_warmup() -> None:
    kw = {**KW, "total_steps": 4}  # total == warmup: nothing left to decay over
    assert lr_at(3, **kw) == 2.0
    assert lr_at(4, **kw) == 2.0
    assert lr_at(5, **kw) == pytest.approx(0.5)
    kw = {**KW, "total_steps": 2}  # fewer total than warmup steps
    assert lr_at(5, **kw) == pytest.approx(0.5)


def test_one_decay_step() -> None:
    kw = {**KW, "total_steps": 5}
    assert (lr_at(4, **kw), lr_at(5, **kw)) == (2.0, pytest.approx(0.5))


@pytest.mark.parametrize("ratio", [0.0, 1.0])
def test_min_lr_ratio_bounds(ratio: float) -> None:
    kw = {**KW, "min_lr_ratio": ratio}
    assert lr_at(14, **kw) == pytest.approx(2.0 * ratio, abs=1e-12)
    if ratio == 1.0:
        assert all(lr_at(s, **kw) == 2.0 for s in range(4, 20))
