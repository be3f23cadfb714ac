"""Sizes as people write them (`zerofit.config.sizes.parse_size`), as the config reads them
(`Size`, `train.gpu_memory_limit`), and the GPU memory cap (`memory_fraction`)."""

from __future__ import annotations

import pytest

from zerofit.config.sizes import gib, memory_fraction, parse_size
from zerofit.errors import UserError
from zerofit.launch.run_config import config_from_dict

KI, MI, GI, TI, PI = (1024**k for k in range(1, 6))


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("24GB", 24 * 10**9),
        ("22GiB", 22 * GI),
        ("512G", 512 * GI),  # no B: binary, as nvidia-smi and free write it
        ("24e9", 24 * 10**9),
        ("1000", 1000),
        ("0", 0),
        ("1k", KI),
        ("1kB", 1000),
        ("1KiB", KI),
        ("3MB", 3 * 10**6),
        ("3M", 3 * MI),
        ("3MiB", 3 * MI),
        ("2TB", 2 * 10**12),
        ("2T", 2 * TI),
        ("1PB", 10**15),
        ("1PiB", PI),
        ("1P", PI),
        (".5GiB", GI // 2),
        ("1.5 TB", 15 * 10**11),
        ("1.5", 1),  # bytes: whole ones
        ("  24 gb  ", 24 * 10**9),
        ("24gib", 24 * GI),
        ("1e3B", 1000),
        ("2.5e-1KiB", 256),
        ("5B", 5),
    ],
)
def test_sizes_people_write(text: str, want: int) -> None:
    assert parse_size(text) == want


@pytest.mark.parametrize("text", ["abc", "", "GB", "1.2.3GB", "24 GBs", "nan", "inf", "1e400"])
def test_what_is_no_size_is_refused(text: str) -> None:
    with pytest.raises(UserError, match=r"^cannot read: .* \(examples: 24GB, 22GiB, 512G, 24e9\)$"):
        parse_size(text)


@pytest.mark.parametrize("text", ["1iB", "5iB"])
def test_ib_without_a_unit_is_refused(text: str) -> None:
    with pytest.raises(UserError, match=r"^cannot read: "):
        parse_size(text)


@pytest.mark.parametrize("text", ["-1GB", " -5", "-0.5GiB"])
def test_negative_sizes_are_named(text: str) -> None:
    with pytest.raises(UserError, match=r"^a size cannot be negative: "):
        parse_size(text)


def test_a_size_too_large_for_a_float_is_refused() -> None:
    with pytest.raises(UserError, match=r"^cannot read: '1e300PB' \(too large; examples"):
        parse_size("1e300PB")


def test_the_minimum_is_inclusive() -> None:
    assert parse_size("10", minimum=10) == 10
    assert parse_size("1KiB", minimum=1024) == 1024
    with pytest.raises(UserError, match=r"^a size must be at least 1,025 byte\(s\), got '1KiB'$"):
        parse_size("1KiB", minimum=1025)
    with pytest.raises(UserError, match="at least 1 byte"):
        parse_size("0", minimum=1)


def test_gib_for_messages() -> None:
    assert gib(GI) == "1.0 GiB"
    assert gib(1024 * GI) == "1,024.0 GiB"
    assert gib(GI * 3 // 2) == "1.5 GiB"


def test_memory_fraction() -> None:
    assert memory_fraction(40 * GI, 80 * GI) == 0.5
    assert memory_fraction(80 * GI, 80 * GI) == 1.0  # the whole card: allowed
    assert memory_fraction(1, 1) == 1.0  # any card that reports memory
    with pytest.raises(UserError) as err:
        memory_fraction(80 * GI + 1, 80 * GI, "the H100")
    assert str(err.value) == (
        f"train.gpu_memory_limit is 80.0 GiB ({80 * GI + 1:,} bytes), more than the 80.0 GiB of "
        "the H100: lower it, or set it to null to use the whole card"
    )
    for total in (0, -1):
        with pytest.raises(UserError, match=rf"^this GPU reports no memory \({total} bytes\)"):
            memory_fraction(GI, total)


@pytest.mark.parametrize(
    ("value", "want"),
    [("24GB", 24 * 10**9), ("22GiB", 22 * GI), (2.4e10, 24 * 10**9), (123, 123), ("1000", 1000)],
)
def test_the_config_reads_sizes(value: object, want: int) -> None:
    cfg = config_from_dict({"train": {"gpu_memory_limit": value}})
    assert cfg.train.gpu_memory_limit == want
    assert type(cfg.train.gpu_memory_limit) is int


@pytest.mark.parametrize(
    ("value", "needle"),
    [
        ("lots", "cannot read: 'lots' (examples: 24GB"),
        ("-1GB", "a size cannot be negative"),
        (2.5, "train.gpu_memory_limit"),
        (True, "train.gpu_memory_limit"),
    ],
)
def test_the_config_refuses_what_is_no_size(value: object, needle: str) -> None:
    with pytest.raises(UserError) as err:
        config_from_dict({"train": {"gpu_memory_limit": value}})
    assert needle in str(err.value)
