"""Rows of training data (`zerofit.data.packing`), checked token by token on small inputs: the
text stream and its cap, rows of seq_len + 1, the overlong policies and their counts, first-fit
placement against a plain reference, the label mask of packed samples (-100 wherever no loss
falls, positions restarting per sample) and the train/val split."""

from __future__ import annotations

import random

import numpy as np
import pytest

from zerofit.data.packing import (
    IGNORE_INDEX,
    PackStats,
    first_fit,
    fit_samples,
    pack,
    pack_samples,
    split_train_val,
    tokenize_stream,
)
from zerofit.data.samples import Sample
from zerofit.data.tokenizers import ByteTokenizer
from zerofit.errors import UserError

EOS = 256


class NoEos(ByteTokenizer):
    eos_id = None


def ids(text: str) -> list[int]:
    return list(text.encode())


# ----------------------------------------------------------------------------- text


def test_documents_are_joined_each_followed_by_eos() -> None:
    out = tokenize_stream(["ab", "", "c"], ByteTokenizer())
    assert out.tolist() == [*ids("ab"), EOS, EOS, *ids("c"), EOS]
    assert out.dtype == np.int32


def test_without_eos_documents_are_just_joined() -> None:
    assert tokenize_stream(["ab", "c"], NoEos()).tolist() == ids("abc")


def test_no_documents_is_an_empty_stream() -> None:
    out = tokenize_stream([], ByteTokenizer())
    assert out.tolist() == [] and out.dtype == np.int32
    assert tokenize_stream([], ByteTokenizer(), max_tokens=5).tolist() == []


@pytest.mark.parametrize("batch_docs", [1, 2, 3, 64])
def test_the_cap_truncates_the_stream(batch_docs: int) -> None:
    docs = ["abc", "de", "fgh", "ij"]
    full = tokenize_stream(docs, ByteTokenizer(), batch_docs=batch_docs)
    assert full.tolist() == [*ids("abc"), EOS, *ids("de"), EOS, *ids("fgh"), EOS, *ids("ij"), EOS]
    for cap in (0, 1, 4, 5, 7, 100):
        out = tokenize_stream(docs, ByteTokenizer(), max_tokens=cap, batch_docs=batch_docs)
        assert out.tolist() == full[:cap].tolist()


def test_reading_stops_at_the_first_batch_that_reaches_the_cap() -> None:
    read: list[int] = []

    def docs():  # noqa: ANN202
        for i in range(100):
            read.append(i)
            yield "abc"  # 4 tokens with EOS

    out = tokenize_stream(docs(), ByteTokenizer(), max_tokens=8, batch_docs=2)
    assert out.tolist() == [*ids("abc"), EOS] * 2
    assert read == [0, 1]  # the first batch holds exactly 8 tokens: no more documents read
    read.clear()
    tokenize_stream(docs(), ByteTokenizer(), max_tokens=9, batch_docs=2)
    assert read == [0, 1, 2, 3]


def test_pack_cuts_rows_of_seq_len_plus_one_and_drops_the_tail() -> None:
    stream = np.arange(11, dtype=np.int32)
    rows = pack(stream, 4)
    assert rows.tolist() == [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]]
    assert pack(stream, 1).tolist() == [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9]]
    assert pack(stream, 10).tolist() == [list(range(11))]
    assert pack(stream, 11).shape == (0, 12)


@pytest.mark.parametrize("seq_len", [0, -1])
def test_pack_refuses_rows_with_no_target(seq_len: int) -> None:
    with pytest.raises(UserError, match=f"seq_len must be >= 1, got {seq_len}"):
        pack(np.arange(10), seq_len)


# ----------------------------------------------------------------------------- samples


def sample(n: int, where: str = "f.jsonl:1", mask: list[bool] | None = None) -> Sample:
    m = np.asarray(mask if mask is not None else [True] * n, dtype=bool)
    return Sample(np.arange(1, n + 1, dtype=np.int32), m, where)


def test_samples_that_fit_are_kept_whole_and_counted() -> None:
    kept, stats = fit_samples([sample(3), sample(5)], seq_len=4, overlong="error")
    assert [len(s.ids) for s in kept] == [3, 5]  # 5 = seq_len + 1: fits exactly
    assert (stats.samples, stats.tokens, stats.truncated_samples, stats.dropped_samples) == (
        2, 8, 0, 0,
    )  # fmt: skip


def test_an_overlong_sample_with_error_names_its_line() -> None:
    with pytest.raises(UserError) as err:
        fit_samples([sample(3), sample(6, "data.jsonl:7")], seq_len=4, overlong="error")
    assert str(err.value) == (
        "data.jsonl:7: sample of 6 tokens is longer than model.seq_len + 1 = 5; raise "
        "model.seq_len or set data.overlong to truncate or drop"
    )


def test_overlong_drop_skips_and_counts() -> None:
    kept, stats = fit_samples([sample(6), sample(2), sample(9)], seq_len=4, overlong="drop")
    assert [len(s.ids) for s in kept] == [2]
    assert (stats.dropped_samples, stats.dropped_tokens) == (2, 15)
    assert (stats.samples, stats.tokens, stats.truncated_samples) == (3, 17, 0)


def test_overlong_truncate_keeps_the_first_tokens_and_their_mask() -> None:
    mask = [False, False, True, True, False, True, True, True]
    kept, stats = fit_samples([sample(8, mask=mask)], seq_len=4, overlong="truncate")
    (s,) = kept
    assert s.ids.tolist() == [1, 2, 3, 4, 5] and s.mask.tolist() == mask[:5]
    assert s.where == "f.jsonl:1"
    assert (stats.truncated_samples, stats.truncated_tokens, stats.tokens) == (1, 3, 8)


@pytest.mark.parametrize(
    ("n", "mask"),
    [
        (1, [True]),  # one token: no target
        (3, [True, False, False]),  # only the first token is masked in: predicted from nothing
        (4, [False] * 4),
    ],
)
def test_samples_with_no_loss_target_are_skipped(n: int, mask: list[bool]) -> None:
    kept, stats = fit_samples([sample(n, mask=mask), sample(2)], seq_len=8, overlong="error")
    assert len(kept) == 1 and stats.skipped_samples == 1
    assert "skipped 1 with no token to learn" in stats.line(True)


def test_a_truncated_sample_left_without_target_is_skipped() -> None:
    mask = [False] * 5 + [True] * 3
    kept, stats = fit_samples([sample(8, mask=mask)], seq_len=4, overlong="truncate")
    assert kept == [] and (stats.truncated_samples, stats.skipped_samples) == (1, 1)


def test_two_token_sample_with_its_target_is_kept() -> None:
    kept, _ = fit_samples([sample(2, mask=[False, True])], seq_len=8, overlong="error")
    assert len(kept) == 1


# ----------------------------------------------------------------------------- first fit


def first_fit_reference(lengths: list[int], capacity: int) -> list[int]:
    free: list[int] = []
    out = []
    for n in lengths:
        row = next((i for i, f in enumerate(free) if f >= n), None)
        if row is None:
            free.append(capacity)
            row = len(free) - 1
        free[row] -= n
        out.append(row)
    return out


def test_first_fit_by_hand() -> None:
    assert first_fit([6, 5, 4, 3, 2], 10) == [0, 1, 0, 1, 1]
    assert first_fit([10, 10, 1], 10) == [0, 1, 2]
    assert first_fit([3, 3, 3, 1], 10) == [0, 0, 0, 0]  # exactly full
    assert first_fit([], 10) == []
    assert first_fit([4], 4) == [0]
    assert first_fit([9, 2, 1], 10) == [0, 1, 0]


@pytest.mark.parametrize("seed", range(6))
def test_first_fit_matches_the_plain_algorithm(seed: int) -> None:
    rng = random.Random(seed)
    capacity = rng.choice([8, 16, 100])
    lengths = [rng.randint(1, capacity) for _ in range(rng.randint(1, 300))]
    assert first_fit(lengths, capacity) == first_fit_reference(lengths, capacity)


# ----------------------------------------------------------------------------- rows and masks


def test_packed_rows_hold_inputs_masked_targets_and_restarting_positions() -> None:
    a = Sample(np.array([10, 11, 12, 13], np.int32), np.array([0, 0, 1, 1], bool), "a")
    b = Sample(np.array([20, 21, 22], np.int32), np.array([0, 1, 1], bool), "b")
    c = Sample(
        np.array([30, 31, 32, 33, 34, 35], np.int32), np.array([1, 0, 1, 0, 1, 1], bool), "c"
    )
    rows, fill = pack_samples([a, b, c], seq_len=6, packing=True)
    assert rows.dtype == np.int32 and rows.shape == (2, 3, 6)
    # row 0: a (3 places) + b (2 places) + 1 of padding; row 1: c (5 places) + 1 of padding
    assert rows[0, 0].tolist() == [10, 11, 12, 20, 21, 0]
    assert rows[0, 1].tolist() == [IGNORE_INDEX, 12, 13, 21, 22, IGNORE_INDEX]
    assert rows[0, 2].tolist() == [0, 1, 2, 0, 1, 0]
    assert rows[1, 0].tolist() == [30, 31, 32, 33, 34, 0]
    assert rows[1, 1].tolist() == [IGNORE_INDEX, 32, IGNORE_INDEX, 34, 35, IGNORE_INDEX]
    assert rows[1, 2].tolist() == [0, 1, 2, 3, 4, 0]
    assert fill == pytest.approx(10 / 12)


def test_padding_is_one_more_document_with_no_loss() -> None:
    a = Sample(np.array([1, 2, 3], np.int32), np.ones(3, bool), "a")
    rows, fill = pack_samples([a], seq_len=6, packing=False)
    assert rows[0, 0].tolist() == [1, 2, 0, 0, 0, 0]
    assert rows[0, 1].tolist() == [2, 3] + [IGNORE_INDEX] * 4
    assert rows[0, 2].tolist() == [0, 1, 0, 1, 2, 3]
    assert fill == pytest.approx(2 / 6)


def test_without_packing_one_sample_per_row() -> None:
    samples = [
        Sample(np.arange(1, n + 1, dtype=np.int32), np.ones(n, bool), "x") for n in (2, 3, 2)
    ]
    rows, fill = pack_samples(samples, seq_len=4, packing=False)
    assert rows.shape == (3, 3, 4)
    assert rows[:, 0].tolist() == [[1, 0, 0, 0], [1, 2, 0, 0], [1, 0, 0, 0]]
    assert fill == pytest.approx(4 / 12)
    packed, packed_fill = pack_samples(samples, seq_len=4, packing=True)
    assert packed.shape == (1, 3, 4) and packed_fill == 1.0  # 1 + 2 + 1 places: one row
    assert packed[0, 0].tolist() == [1, 1, 2, 1]


def test_no_samples_no_rows() -> None:
    rows, fill = pack_samples([], seq_len=4, packing=True)
    assert rows.shape == (0, 3, 4) and fill == 0.0


def test_a_full_row_has_no_padding() -> None:
    a = Sample(np.arange(1, 6, dtype=np.int32), np.ones(5, bool), "a")
    rows, fill = pack_samples([a], seq_len=4, packing=True)
    assert rows[0].tolist() == [[1, 2, 3, 4], [2, 3, 4, 5], [0, 1, 2, 3]]
    assert fill == 1.0


def test_stats_line_and_dict() -> None:
    stats = PackStats(
        samples=3, tokens=30, truncated_samples=1, truncated_tokens=4, rows=2, fill=0.5
    )
    assert stats.line(True) == (
        "3 samples (30 tokens) packed first-fit into 2 sequences, 50.0% filled; truncated 1 "
        "samples (4 tokens), dropped 0 (0 tokens)"
    )
    assert stats.line(False).startswith("3 samples (30 tokens) one per sequence in 2 sequences")
    assert stats.as_dict()["truncated_tokens"] == 4 and stats.as_dict()["fill"] == 0.5


# ----------------------------------------------------------------------------- split


def test_no_validation_split() -> None:
    seqs = np.arange(10)[:, None]
    train, val = split_train_val(seqs, 0.0)
    assert train.tolist() == seqs.tolist() and len(val) == 0


@pytest.mark.parametrize(
    ("n", "fraction", "n_val"),
    [(10, 0.1, 1), (10, 0.01, 1), (10, 0.26, 3), (4, 0.5, 2), (2, 0.4, 1)],
)
def test_the_split_is_disjoint_and_holds_out_at_least_one(
    n: int, fraction: float, n_val: int
) -> None:
    seqs = np.arange(n)[:, None]
    train, val = split_train_val(seqs, fraction, seed=3)
    assert len(val) == n_val and len(train) == n - n_val
    assert sorted(train[:, 0].tolist() + val[:, 0].tolist()) == list(range(n))
    again_train, again_val = split_train_val(seqs, fraction, seed=3)
    assert again_val.tolist() == val.tolist() and again_train.tolist() == train.tolist()


def test_the_split_depends_on_the_seed() -> None:
    seqs = np.arange(100)[:, None]
    vals = {tuple(split_train_val(seqs, 0.1, seed=s)[1][:, 0].tolist()) for s in range(4)}
    assert len(vals) == 4


@pytest.mark.parametrize(("n", "fraction"), [(1, 0.5), (2, 0.9), (1, 0.01)])
def test_too_few_rows_to_hold_out_is_refused(n: int, fraction: float) -> None:
    with pytest.raises(UserError, match=f"only {n} packed sequences: too few to hold out"):
        split_train_val(np.arange(n)[:, None], fraction)


@pytest.mark.parametrize("fraction", [1.0, -0.1])
def test_a_fraction_outside_zero_one_is_refused(fraction: float) -> None:
    with pytest.raises(UserError, match=r"val_fraction must be in \[0, 1\)"):
        split_train_val(np.arange(10)[:, None], fraction)
