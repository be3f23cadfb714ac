"""Preference pairs (data.format: preference): standard, conversational and implicit-prompt records,
loss on the responses only, both documents of a pair in one row (chosen first), the pair-id
channel, the split by pair, overlong pairs, one-line errors, the loader's 4-tuples, the preview."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from sft_helpers import CHAT, write_jsonl

from zerofit.cli import main
from zerofit.data import (
    IGNORE_INDEX,
    ByteTokenizer,
    GlobalBatch,
    PackedLoader,
    Pair,
    Sample,
    SampleOptions,
    build_data,
    eval_batches,
    fit_pairs,
    iter_sample_records,
    load_tokenizer,
    pack_pairs,
    pair_ids,
    real_tokens,
    render_pairs,
    render_samples,
    split_pairs,
    to_batch,
    truncate_pair,
)
from zerofit.errors import UserError

PREF = SampleOptions("preference")
USER, SYSTEM = CHAT[1], CHAT[0]
GOOD, BAD = {"role": "assistant", "content": "cat red"}, {"role": "assistant", "content": "red"}


def _pairs(path: Path, tok: str, opts: SampleOptions = PREF) -> list[Pair]:
    records = iter_sample_records(str(path))
    t = load_tokenizer(tok)
    return list(render_pairs(records, t, opts.fields(), opts.train_on, tok, None, opts.role_map()))


def _template(tok_dir: Path, messages: list[dict], generation: bool = False) -> list[int]:
    hf = load_tokenizer(str(tok_dir)).hf
    ids = hf.apply_chat_template(messages, tokenize=True, add_generation_prompt=generation)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


def _loss_text(tok_dir: Path, s: Sample) -> list[str]:
    """The decoded runs of loss tokens."""
    tok = load_tokenizer(str(tok_dir))
    edges = np.flatnonzero(np.diff(np.concatenate([[0], s.mask.astype(int), [0]])))
    return [tok.decode(s.ids[a:b]) for a, b in zip(edges[::2], edges[1::2], strict=True)]


# ----------------------------------------------------------------------------- records


def test_standard_record_is_plain_text_loss_on_the_response(tmp_path: Path, tok_dir: Path) -> None:
    src = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "ab", "chosen": "cd", "rejected": "e"}])
    (p,) = _pairs(src, "byte")
    assert p.chosen.ids.tolist() == [97, 98, 99, 100, 256] and p.chosen_prompt == 2
    assert p.chosen.mask.tolist() == [False, False, True, True, True]
    assert p.rejected.ids.tolist() == [97, 98, 101, 256] and p.rejected_prompt == 2
    assert p.rejected.mask.tolist() == [False, False, True, True]
    # a chat template changes nothing: plain text, as prompt_completion renders it
    rec = {"prompt": "red cat", "chosen": " dog", "rejected": " sun"}
    (p,) = _pairs(src := write_jsonl(tmp_path / "q.jsonl", [rec]), str(tok_dir))
    pc = write_jsonl(tmp_path / "pc.jsonl", [{"prompt": "red cat", "completion": " dog"}])
    opts = SampleOptions("prompt_completion")
    records, tok = iter_sample_records(str(pc)), load_tokenizer(str(tok_dir))
    (s,) = render_samples(records, tok, opts.format, opts.fields(), "completion", str(tok_dir))
    assert p.chosen.ids.tolist() == s.ids.tolist() and p.chosen.mask.tolist() == s.mask.tolist()
    (every,) = _pairs(src, str(tok_dir), SampleOptions("preference", train_on="all"))
    assert every.chosen.mask.all() and every.rejected.mask.all()


def test_conversational_record_learns_only_the_response(tmp_path: Path, tok_dir: Path) -> None:
    prompt = CHAT[:4]  # system, user, assistant (an earlier turn: no loss), user
    rec = {"prompt": prompt, "chosen": [GOOD], "rejected": [BAD]}
    (p,) = _pairs(write_jsonl(tmp_path / "c.jsonl", [rec]), str(tok_dir))
    assert p.chosen.ids.tolist() == _template(tok_dir, [*prompt, GOOD])
    assert p.rejected.ids.tolist() == _template(tok_dir, [*prompt, BAD])
    assert _loss_text(tok_dir, p.chosen) == ["cat red<|im_end|>\n"]  # not "cat red" of turn 2
    assert _loss_text(tok_dir, p.rejected) == ["red<|im_end|>\n"]
    head = _template(tok_dir, prompt, generation=True)  # up to the assistant header
    assert p.chosen_prompt == p.rejected_prompt == len(head)
    assert p.chosen.ids[: len(head)].tolist() == head
    # a string prompt is one user turn; a string response one assistant turn
    mixed = [
        {"prompt": USER["content"], "chosen": [GOOD], "rejected": [BAD]},
        {"prompt": [USER], "chosen": GOOD["content"], "rejected": BAD["content"]},
    ]
    for q in _pairs(write_jsonl(tmp_path / "m.jsonl", mixed), str(tok_dir)):
        assert q.chosen.ids.tolist() == _template(tok_dir, [USER, GOOD])
        assert _loss_text(tok_dir, q.rejected) == ["red<|im_end|>\n"]


def test_implicit_prompt_is_the_common_prefix(tmp_path: Path, tok_dir: Path) -> None:
    shared = CHAT[:4]
    explicit = {"prompt": shared, "chosen": [GOOD], "rejected": [BAD]}
    implicit = {"chosen": [*shared, GOOD], "rejected": [*shared, BAD]}
    same = {"chosen": [*shared, GOOD], "rejected": [*shared, GOOD]}  # allowed, counted
    a, b, c = _pairs(write_jsonl(tmp_path / "h.jsonl", [explicit, implicit, same]), str(tok_dir))
    for x, y in ((a.chosen, b.chosen), (a.rejected, b.rejected)):
        assert x.ids.tolist() == y.ids.tolist() and x.mask.tolist() == y.mask.tolist()
    assert (a.chosen_prompt, a.rejected_prompt) == (b.chosen_prompt, b.rejected_prompt)
    assert (
        c.identical
        and not a.identical
        and _loss_text(tok_dir, c.rejected) == ["cat red<|im_end|>\n"]
    )
    kept, stats = fit_pairs([a, b, c], 128, "error")
    assert len(kept) == 3 and stats.identical_pairs == 1
    assert "1 with chosen = rejected" in stats.line(True)


def test_field_names_columns_and_roles(tmp_path: Path, tok_dir: Path) -> None:
    bot = {"speaker": "bot", "text": "cat red"}
    rec = {"q": [{"speaker": "user", "text": "red cat"}], "good": [bot], "bad": "x", "no": "y"}
    src = write_jsonl(tmp_path / "f.jsonl", [rec])
    opts = SampleOptions(
        "preference",
        prompt_field="q",
        chosen_field="good",
        columns=(("content", "text"), ("rejected", "bad"), ("role", "speaker")),
        roles=(("bot", "assistant"),),
    )
    (p,) = _pairs(src, str(tok_dir), opts)
    assert p.chosen.ids.tolist() == _template(tok_dir, [USER, GOOD])
    assert _loss_text(tok_dir, p.rejected) == ["x<|im_end|>\n"]


BAD_RECORDS = {
    "missing chosen": ({"prompt": "a", "rejected": "b"}, r"no field 'chosen' .*data\.chosen_field"),
    "empty rejected": ({"prompt": "a", "chosen": "b", "rejected": " "}, r"'rejected' is empty"),
    "empty list": ({"prompt": "a", "chosen": [], "rejected": "b"}, r"'chosen' is an empty list"),
    "wrong type": ({"prompt": 3, "chosen": "b", "rejected": "c"}, r"'prompt' must be a string"),
    "no prompt": ({"chosen": "b", "rejected": "c"}, r"no field 'prompt' .*whole conversations"),
    "no assistant": (
        {"prompt": [USER], "chosen": [USER], "rejected": [GOOD]},
        r"no assistant turn: nothing to learn",
    ),
    "bad message": (
        {"prompt": "a", "chosen": [{"content": "b"}], "rejected": "c"},
        r" \(chosen\): message 0 must be an object with 'role' and 'content'",
    ),
}


@pytest.mark.parametrize("case", list(BAD_RECORDS))
def test_bad_record_is_one_line_naming_its_line(case: str, tmp_path: Path, tok_dir: Path) -> None:
    record, pattern = BAD_RECORDS[case]
    good = {"prompt": "a", "chosen": "b", "rejected": "c"}
    src = write_jsonl(tmp_path / "bad.jsonl", [good, record])
    with pytest.raises(UserError) as err:
        build_data(str(src), str(tok_dir), "text", 64, 0.0, None, samples=PREF)
    line = str(err.value)
    assert "\n" not in line and re.search(r"bad\.jsonl:2\b", line), line
    assert re.search(pattern, line), line


def test_conversational_pair_without_a_template(tmp_path: Path) -> None:
    src = write_jsonl(
        tmp_path / "c.jsonl", [{"prompt": [USER], "chosen": [GOOD], "rejected": [BAD]}]
    )
    with pytest.raises(UserError, match=r"c\.jsonl:1: a conversational pair: .*chat template"):
        _pairs(src, "byte")


def test_chat_format_on_preference_records_names_the_format(tmp_path: Path) -> None:
    src = write_jsonl(tmp_path / "c.jsonl", [{"prompt": "a", "chosen": "b", "rejected": "c"}])
    opts, records = SampleOptions("prompt_completion"), iter_sample_records(str(src))
    with pytest.raises(UserError, match=r"looks like data\.format=preference"):
        list(render_samples(records, ByteTokenizer(), opts.format, opts.fields(), "all", "byte"))


# ----------------------------------------------------------------------------- rows


def _doc(n: int, prompt: int, start: int = 10) -> Sample:
    mask = np.zeros(n, dtype=bool)
    mask[prompt:] = True
    return Sample(np.arange(start, start + n, dtype=np.int32), mask, "f:1")


def _pair(prompt: int, chosen: int, rejected: int, where: str = "f:1") -> Pair:
    c, r = _doc(prompt + chosen, prompt), _doc(prompt + rejected, prompt, start=100)
    return Pair(c, r, prompt, prompt, where)


def test_pairs_pack_whole_chosen_first_with_signed_ids() -> None:
    pairs = [_pair(2, 2, 1), _pair(3, 3, 2), _pair(1, 2, 2)]  # places 5, 9, 4
    rows, fill = pack_pairs(pairs, 10, packing=True)
    assert rows.shape == (2, 4, 10) and fill == pytest.approx(18 / 20)
    inputs, targets, positions, ids = rows[0]  # pair 0 (3 + 2 places), pair 2 (2 + 2)
    assert positions.tolist() == [0, 1, 2, 0, 1, 0, 1, 0, 1, 0]
    assert inputs[:5].tolist() == [10, 11, 12, 100, 101]  # chosen, then rejected
    assert targets[:5].tolist() == [IGNORE_INDEX, 12, 13, IGNORE_INDEX, 102]
    assert ids.tolist() == [0, 1, 1, 0, -1, 3, 3, -3, -3, 0]
    assert (targets != IGNORE_INDEX).tolist() == (ids != 0).tolist()
    assert rows[1, 3].tolist() == [0, 0, 2, 2, 2, 0, 0, -2, -2, 0]
    alone, _ = pack_pairs(pairs, 10, packing=False)
    assert alone.shape == (3, 4, 10) and pair_ids(alone[2:]).tolist() == [2]
    assert sorted(pair_ids(rows).tolist()) == [0, 1, 2]


def test_overlong_truncate_drop_error() -> None:
    # 3-token prompts, responses 6 and 2: 14 tokens, 12 places > 10: the longer cut to 4
    p = truncate_pair(_pair(3, 6, 2), 10)
    sizes = (p.chosen_prompt, p.rejected_prompt, len(p.chosen.ids), len(p.rejected.ids))
    assert sizes == (3, 3, 7, 5) and p.places == 10
    assert p.chosen.ids.tolist() == list(range(10, 17)) and p.chosen.mask[3:].all()
    # both long: cut to one common length; the prompt kept
    q = truncate_pair(_pair(2, 9, 7), 12)  # room 14 tokens: prompts 4, responses 5 each
    assert (len(q.chosen.ids), len(q.rejected.ids), q.chosen_prompt) == (7, 7, 2)
    # a prompt that leaves the responses fewer than seq_len // 4 tokens: cut from the left
    r = truncate_pair(_pair(10, 6, 6), 16)  # room 18: responses keep 4 each, prompts 5
    assert (r.chosen_prompt, len(r.chosen.ids)) == (5, 9)
    assert r.chosen.ids[:5].tolist() == [15, 16, 17, 18, 19]  # the prompt's end
    assert r.chosen.mask.tolist() == [False] * 5 + [True] * 4 and r.places == 16
    pairs = [_pair(2, 2, 2), _pair(3, 6, 2, "long.jsonl:7"), _pair(9, 1, 1)]
    kept, stats = fit_pairs(pairs, 10, "truncate")
    assert [k.places for k in kept] == [6, 10, 10] and stats.truncated_samples == 2
    assert stats.truncated_tokens == (14 - 12) + (20 - 12)
    kept, stats = fit_pairs(pairs, 10, "drop")
    assert len(kept) == 1 and (stats.dropped_samples, stats.dropped_tokens) == (2, 14 + 20)
    with pytest.raises(UserError, match=r"^long\.jsonl:7: pair of 9 \+ 5 tokens .* 12 places"):
        fit_pairs(pairs, 10, "error")


def _records(n: int) -> list[dict]:
    """Distinct standard pairs; record i's prompt names i."""
    return [
        {"prompt": f"q{i:03d} " + "x" * (i % 7), "chosen": "y" * (2 + i % 5), "rejected": f"n{i}"}
        for i in range(n)
    ]


def _row_pairs(rows: np.ndarray) -> dict[int, tuple[str, str]]:
    """g -> the (chosen, rejected) responses of every pair in byte rows, read off the targets
    the pair-id channel marks."""
    out = {}
    for row in rows:
        for g in pair_ids(row[None]).tolist():
            c, r = (ByteTokenizer().decode(row[1][row[3] == s * (g + 1)]) for s in (1, -1))
            assert g not in out, f"pair {g} twice"
            out[g] = (c, r)
    return out


def test_split_by_pair_with_ids_per_split(tmp_path: Path) -> None:
    src = write_jsonl(tmp_path / "p.jsonl", _records(40))
    b = build_data(str(src), "byte", "text", 48, 0.25, None, seed=3, samples=PREF)
    assert b.paired and b.n_pairs == (30, 10) and b.train.shape[1:] == (4, 48)
    assert b.stats.train_pairs == 30 and "30 train / 10 val pairs" in b.report_line()
    train, val = _row_pairs(b.train), _row_pairs(b.val)
    assert sorted(train) == list(range(30)) and sorted(val) == list(range(10))
    for rows in (b.train, b.val):  # the pair channel marks exactly the loss places
        assert ((rows[:, 3] != 0) == (rows[:, 1] != IGNORE_INDEX)).all()
        for row in rows:  # both documents of a pair in one row, the chosen first
            for g in pair_ids(row[None]):
                c, r = np.flatnonzero(row[3] == g + 1), np.flatnonzero(row[3] == -(g + 1))
                assert len(c) and len(r) and c.max() < r.min()
    rejected = [v[1] for v in train.values()] + [v[1] for v in val.values()]
    assert sorted(rejected) == sorted(f"n{i}" for i in range(40))  # none on both sides, or lost
    # ids follow record order within a split (record i's rejected response is f"n{i}")
    order = [int(train[g][1][1:]) for g in range(30)]
    assert order == sorted(order)
    assert [int(val[g][1][1:]) for g in range(10)] == sorted(set(range(40)) - set(order))


def test_ids_are_the_same_across_builds(tmp_path: Path) -> None:
    def build(name: str, seed: int) -> tuple[np.ndarray, np.ndarray]:
        src = write_jsonl(tmp_path / name, _records(30))  # a new file: rendered again, not cached
        b = build_data(str(src), "byte", "text", 48, 0.2, None, seed=seed, samples=PREF)
        return b.train, b.val

    (a_train, a_val), (b_train, b_val) = build("a.jsonl", 1), build("b.jsonl", 1)
    assert np.array_equal(a_train, b_train) and np.array_equal(a_val, b_val)
    c_val = build("c.jsonl", 2)[1]
    assert _row_pairs(a_val) != _row_pairs(c_val)  # the seed picks the held-out pairs
    pairs = _pairs(write_jsonl(tmp_path / "d.jsonl", _records(10)), "byte")
    assert split_pairs(pairs, 0.2, seed=1) == split_pairs(pairs, 0.2, seed=1)


def test_loader_and_eval_give_4_tuples(tmp_path: Path) -> None:
    src = write_jsonl(tmp_path / "p.jsonl", _records(60))
    b = build_data(str(src), "byte", "text", 48, 0.1, None, samples=PREF)
    kw = {"micro_batch_size": 2, "grad_accum_steps": 2, "dp_rank": 0, "dp_size": 1, "seed": 4}
    loader = PackedLoader(b.train, shuffle=False, **kw)
    assert loader.paired and loader.masked
    batch = loader.next_microbatch()
    assert len(batch) == 4 and all(t.dtype == torch.int64 and t.shape == (2, 48) for t in batch)
    for c in range(4):
        assert torch.equal(batch[c], torch.as_tensor(b.train[:2, c]).long())
    places = [int(np.flatnonzero(row[3] != 0).max()) + 1 for row in b.train[:2]]
    assert real_tokens(batch) == sum(places)  # the rejected's last place ends each row's pairs
    (ev,) = eval_batches(b.val, 2, 0, 1, max_batches=1)
    want = torch.as_tensor(b.val[np.arange(2) % len(b.val), 3]).long()
    assert len(ev) == 4 and torch.equal(ev[3], want)
    assert len(to_batch(b.train[:1, :3])) == 3  # fine-tuning rows stay 3-tuples


def test_too_few_pairs_is_one_line(tmp_path: Path) -> None:
    src = write_jsonl(tmp_path / "p.jsonl", _records(1))
    with pytest.raises(UserError, match=r"1 pair is too few to hold out 1 for validation"):
        build_data(str(src), "byte", "text", 48, 0.1, None, samples=PREF)
    src = write_jsonl(tmp_path / "q.jsonl", _records(10))  # one pair a row: 8 train, 2 val
    one_each = SampleOptions("preference", packing=False)
    build_data(str(src), "byte", "text", 48, 0.2, None, 0, one_each, GlobalBatch(8, 1, 1))
    with pytest.raises(UserError) as err:
        build_data(str(src), "byte", "text", 48, 0.2, None, 0, one_each, GlobalBatch(3, 3, 1))
    line = str(err.value)
    assert "\n" not in line and line.startswith("data: 8 training rows (8 pairs) are too few")
    assert "this fits: train.micro_batch_size=2" in line
    assert "data.val_fraction=0 (it holds out 2 pairs)" in line


# ----------------------------------------------------------------------------- the CLI


def _config(tmp: Path, tok_dir: Path, records: list[dict]) -> Path:
    src = write_jsonl(tmp / "pairs.jsonl", records)
    cfg = {
        "model": {"preset": "tiny", "seq_len": 64},
        "data": {"format": "preference", "source": str(src), "tokenizer": str(tok_dir)},
        "train": {"objective": "dpo"},
    }
    path = tmp / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def test_preview_shows_pairs(tmp_path: Path, tok_dir: Path, capsys) -> None:
    records = [{"prompt": [USER], "chosen": [GOOD], "rejected": [BAD]}] * 8
    cfg = _config(tmp_path, tok_dir, records)
    code = main(["data", "preview", "-c", str(cfg), "--out", str(tmp_path / "out"), "--rows", "1"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "pair 0, chosen" in out and "pair 0, rejected" in out and "pair(s)" in out
    assert "[[cat red<|im_end|>↵]]" in out and "[[red<|im_end|>↵]]" in out
    assert re.search(r"pairs \(train / val\)\s*[│|]\s*7 / 1", out), out
    assert "pair 0, chosen" in (tmp_path / "out" / "preview.html").read_text()


def test_bad_record_through_the_cli(tmp_path: Path, tok_dir: Path, capsys) -> None:
    records = [{"prompt": "a", "chosen": "b", "rejected": "c"}, {"prompt": "a", "chosen": "b"}]
    cfg = _config(tmp_path, tok_dir, records)
    code = main(["data", "preview", "-c", str(cfg), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and err.startswith("error: "), err
    assert re.search(r"pairs\.jsonl:2: no field 'rejected'", err), err
