"""AdamW's value checks (`zerofit.config.limits.check_optim`) at their exact boundaries, and `shown`.

Each bound is tested on both sides: a check that is dropped or moved by one ulp fails here, not in
a training run that diverges (weight decay at or above 1/lr flips or zeroes every weight each step:
AdamW multiplies them by 1 - lr x weight_decay).
"""

from __future__ import annotations

import math

import pytest

from zerofit.config.limits import check_optim, shown
from zerofit.config.schema import OptimConfig
from zerofit.errors import UserError
from zerofit.launch.run_config import config_from_dict, load_config

INF = math.inf
WD_LINE = (
    r"optim\.weight_decay must be finite, >= 0 and below 1/lr \(AdamW multiplies weights by "
    r"1 - lr x weight_decay each step\), got "
)


def below(x: float) -> float:
    return math.nextafter(x, -INF)


def above(x: float) -> float:
    return math.nextafter(x, INF)


def optim(**kw: object) -> OptimConfig:
    return OptimConfig(**kw)  # type: ignore[arg-type]


LRS = [0.5, 0.25, 1e-3, 3e-4, 2.0]


@pytest.mark.parametrize("lr", LRS)
def test_weight_decay_at_one_over_lr_is_refused(lr: float) -> None:
    with pytest.raises(UserError, match=WD_LINE):
        check_optim(optim(lr=lr, weight_decay=1 / lr))


@pytest.mark.parametrize("lr", LRS)
def test_weight_decay_just_above_one_over_lr_is_refused(lr: float) -> None:
    with pytest.raises(UserError, match=WD_LINE):
        check_optim(optim(lr=lr, weight_decay=above(1 / lr)))
    with pytest.raises(UserError, match=WD_LINE):
        check_optim(optim(lr=lr, weight_decay=2 / lr))


@pytest.mark.parametrize("lr", LRS)
def test_weight_decay_just_below_one_over_lr_is_accepted(lr: float) -> None:
    check_optim(optim(lr=lr, weight_decay=below(1 / lr)))


def test_weight_decay_bound_is_refused_through_the_config_too() -> None:
    with pytest.raises(UserError, match=WD_LINE + "2.0"):
        config_from_dict({"optim": {"lr": 0.5, "weight_decay": 2.0}})
    with pytest.raises(UserError, match=WD_LINE):
        load_config(None, ["optim.lr=0.5", "optim.weight_decay=2.0"])
    cfg = config_from_dict({"optim": {"lr": 0.5, "weight_decay": 1.9}})
    assert cfg.optim.weight_decay == 1.9


@pytest.mark.parametrize("wd", [0.0, 1e-300, 0.1])
def test_weight_decay_zero_and_small_are_accepted(wd: float) -> None:
    check_optim(optim(lr=1e-3, weight_decay=wd))


@pytest.mark.parametrize("wd", [-1e-300, -0.1, INF, -INF, math.nan])
def test_weight_decay_negative_or_not_finite_is_refused(wd: float) -> None:
    with pytest.raises(UserError, match=WD_LINE):
        check_optim(optim(lr=1e-3, weight_decay=wd))


@pytest.mark.parametrize("lr", [0.0, -0.0, -1e-3, INF, math.nan])
def test_lr_must_be_finite_and_positive(lr: float) -> None:
    with pytest.raises(UserError, match=r"optim\.lr must be a finite number > 0, got "):
        check_optim(optim(lr=lr, weight_decay=0.0))


def test_the_smallest_positive_lr_is_accepted() -> None:
    check_optim(optim(lr=5e-324, weight_decay=0.0))
    check_optim(optim(lr=1e-8, weight_decay=0.0))


@pytest.mark.parametrize(
    "betas", [(0.0, 0.0), (below(1.0), below(1.0)), (0.9, 0.999), (0.0, 0.95), (0.9, 0.0)]
)
def test_betas_in_zero_to_one_are_accepted(betas: tuple[float, float]) -> None:
    check_optim(optim(betas=betas))


@pytest.mark.parametrize(
    "betas",
    [
        (1.0, 0.95),
        (0.9, 1.0),
        (above(1.0), 0.5),
        (-5e-324, 0.9),
        (0.9, -0.1),
        (math.nan, 0.9),
        (0.9, INF),
        (-INF, 0.9),
    ],
)
def test_betas_outside_zero_to_one_are_refused(betas: tuple[float, float]) -> None:
    with pytest.raises(UserError, match=r"optim\.betas must be in \[0, 1\), got \["):
        check_optim(optim(betas=betas))


@pytest.mark.parametrize("eps", [0.0, -1e-8, INF, math.nan])
def test_eps_must_be_finite_and_positive(eps: float) -> None:
    with pytest.raises(UserError, match=r"optim\.eps must be a finite number > 0, got "):
        check_optim(optim(eps=eps))


@pytest.mark.parametrize("eps", [5e-324, 1e-8, 1.0])
def test_positive_eps_is_accepted(eps: float) -> None:
    check_optim(optim(eps=eps))


@pytest.mark.parametrize("ratio", [0.0, 1.0, 0.5, below(1.0)])
def test_min_lr_ratio_in_the_closed_interval_is_accepted(ratio: float) -> None:
    check_optim(optim(min_lr_ratio=ratio))


@pytest.mark.parametrize("ratio", [above(1.0), 2.0, -5e-324, -0.1, math.nan, INF])
def test_min_lr_ratio_outside_zero_one_is_refused(ratio: float) -> None:
    with pytest.raises(UserError, match=r"optim\.min_lr_ratio must be in \[0, 1\], got "):
        check_optim(optim(min_lr_ratio=ratio))


@pytest.mark.parametrize("clip", [None, 5e-324, 1.0, 1e30])
def test_grad_clip_positive_or_null_is_accepted(clip: float | None) -> None:
    check_optim(optim(grad_clip=clip))


@pytest.mark.parametrize("clip", [0.0, -1.0, INF, math.nan])
def test_grad_clip_zero_negative_or_not_finite_is_refused(clip: float) -> None:
    with pytest.raises(
        UserError, match=r"optim\.grad_clip must be a finite number > 0, or null, got "
    ):
        check_optim(optim(grad_clip=clip))


def test_defaults_pass() -> None:
    check_optim(OptimConfig())


# ----------------------------------------------------------------------------- shown


def test_shown_keeps_short_values_whole() -> None:
    assert shown("abc") == "'abc'"
    assert shown("x" * 100) == repr("x" * 100)
    assert shown("a b", quote=False) == "a b"
    assert shown(12345) == "12345"
    assert shown(True) == "True"


def test_shown_cuts_at_the_limit_with_an_ellipsis() -> None:
    text = "y" * 200
    assert shown(text, quote=False) == text  # exactly the limit: whole
    assert shown(text + "z", quote=False) == text + "..."
    assert shown("y" * 50, quote=False, limit=10) == "y" * 10 + "..."
    assert shown("y" * 10, quote=False, limit=10) == "y" * 10


def test_shown_cuts_a_long_raw_text_even_when_the_words_fit() -> None:
    # 400 characters of separators collapse to nothing, yet the raw text was long: cut
    raw = " " * 401 + "end"
    out = shown(raw, quote=False)
    assert out.endswith("...")


def test_shown_names_huge_numbers_by_their_digits() -> None:
    assert not shown(2**256 - 1).startswith("<a")  # 256 bits: still printed (cut by reprlib)
    for n in (2**256, 2**257, 10**100, 10**1000):  # more than 256 bits
        assert shown(n) == f"<a {len(str(n))}-digit number>"


def test_shown_replaces_unprintable_characters_on_one_line() -> None:
    assert shown("a\tb\nc\x1bd\x00", quote=False) == "a b c?d?"


def test_shown_cuts_a_raw_text_of_exactly_twice_the_limit_only_past_it() -> None:
    assert shown(" " * 397 + "end", quote=False) == "end"  # 400 characters: not cut
    assert shown(" " * 398 + "end", quote=False) == "en..."  # 401: read up to 400, cut
    assert shown(" " * 300 + "word", quote=False) == "word"  # words from the first 400 chars
    assert shown(" " * 400 + "late", quote=False) == "..."  # past them: not read


@pytest.mark.parametrize(("n", "ok"), [(10_000, True), (10_001, False)])
def test_a_config_string_holds_at_most_ten_thousand_characters(n: int, ok: bool) -> None:
    data = {"data": {"field": "x" * n}}
    if ok:
        assert config_from_dict(data).data.field == "x" * n
    else:
        with pytest.raises(UserError, match=r"too long \(10001 characters; at most 10000\)"):
            config_from_dict(data)
