from __future__ import annotations

import json
from itertools import islice

import numpy as np
import pytest
import torch

from zerofit.data import (
    ByteTokenizer,
    PackedLoader,
    build_data,
    eval_batches,
    iter_documents,
    load_tokenizer,
    pack,
    split_train_val,
    tokenize_stream,
)
from zerofit.errors import UserError


def _seqs(n: int, t: int = 5) -> np.ndarray:
    # row i holds value i everywhere, so a batch reveals which sequences it holds
    return np.repeat(np.arange(n, dtype=np.int32)[:, None], t + 1, axis=1)


def _ids(batch: tuple[torch.Tensor, torch.Tensor]) -> list[int]:
    return batch[0][:, 0].tolist()


def test_byte_roundtrip_and_eos() -> None:
    tok = ByteTokenizer()
    text = "héllo, wörld ✓\n"
    ids = tok.encode(text)
    assert tok.vocab_size == 257 and tok.eos_id == 256
    assert ids.max() < 256 and tok.decode(ids) == text
    stream = tokenize_stream(["ab", "c"], tok)
    assert stream.tolist() == [97, 98, 256, 99, 256]
    assert tok.decode(stream) == "abc"


def test_stdlib_source_deterministic() -> None:
    a = list(islice(iter_documents("stdlib", "text"), 20))
    b = list(islice(iter_documents("stdlib", "text"), 20))
    assert len(a) == 20 and a == b and all(isinstance(d, str) and d for d in a)


def test_pack_shift_and_eos() -> None:
    tok = ByteTokenizer()
    stream = tokenize_stream(["abcd", "efg", "hijklmn"], tok)
    seqs = pack(stream, seq_len=4)
    assert seqs.shape == (len(stream) // 5, 5)
    assert (seqs.reshape(-1) == stream[: seqs.size]).all()
    assert seqs[0].tolist() == [97, 98, 99, 100, 256]
    loader = PackedLoader(
        seqs, micro_batch_size=1, grad_accum_steps=1, dp_rank=0, dp_size=1, seed=0, shuffle=False
    )
    x, y = loader.next_microbatch()
    assert x.dtype == torch.int64 and x.shape == (1, 4) and y.shape == (1, 4)
    assert x[0, 1:].tolist() == y[0, :-1].tolist()
    assert y[0, -1].item() == 256


def test_max_tokens_caps() -> None:
    tok = ByteTokenizer()
    assert len(tokenize_stream(["x" * 100] * 10, tok, max_tokens=250)) == 250
    b = build_data("stdlib", "byte", "text", 64, 0.05, max_tokens=20_000)
    assert b.num_tokens == 20_000 and b.train.shape[1] == 65


def test_txt_jsonl_dir_sources(tmp_path) -> None:
    d = tmp_path / "corpus"
    (d / "sub").mkdir(parents=True)
    (d / "a.txt").write_text("first doc\n\nstill first")
    (d / "sub" / "b.jsonl").write_text(
        json.dumps({"text": "second"}) + "\n\n" + json.dumps({"text": "third", "x": 1}) + "\n"
    )
    (d / "ignored.md").write_text("nope")
    assert list(iter_documents(str(d / "a.txt"), "text")) == ["first doc\n\nstill first"]
    assert list(iter_documents(str(d / "sub" / "b.jsonl"), "text")) == ["second", "third"]
    assert list(iter_documents(str(d), "text")) == ["first doc\n\nstill first", "second", "third"]
    both = [str(d / "sub" / "b.jsonl"), str(d / "a.txt")]
    assert list(iter_documents(both, "text"))[0] == "second"


def test_jsonl_errors_name_line(tmp_path) -> None:
    p = tmp_path / "bad.jsonl"
    p.write_text('{"text": "ok"}\n{"body": "no text"}\n')
    with pytest.raises(UserError, match=r"bad\.jsonl:2"):
        list(iter_documents(str(p), "text"))
    p.write_text('{"text": "ok"}\n{not json\n')
    with pytest.raises(UserError, match=r"bad\.jsonl:2"):
        list(iter_documents(str(p), "text"))
    with pytest.raises(UserError, match="not found"):
        list(iter_documents(str(tmp_path / "missing.txt"), "text"))
    with pytest.raises(UserError, match="not found"):
        load_tokenizer(str(tmp_path / "nope.json"))


def test_train_val_disjoint() -> None:
    seqs = _seqs(100)
    train, val = split_train_val(seqs, 0.05, seed=3)
    tr, va = set(train[:, 0].tolist()), set(val[:, 0].tolist())
    assert len(va) == 5 and len(tr) == 95 and not tr & va and tr | va == set(range(100))
    train2, val2 = split_train_val(seqs, 0.05, seed=3)
    assert (val2 == val).all() and (train2 == train).all()
    assert len(split_train_val(_seqs(3), 0.01)[1]) == 1
    # index-disjoint, not content-disjoint: the stdlib repeats boilerplate (license headers...)
    b = build_data("stdlib", "byte", "text", 32, 0.1, max_tokens=50_000)
    assert len(b.train) + len(b.val) == 50_000 // 33 and len(b.val) == round(0.1 * (50_000 // 33))


def test_rank_layout_matches_grad_accum() -> None:
    seqs = _seqs(64)
    kw = {"micro_batch_size": 3, "seed": 7}
    single = PackedLoader(seqs, grad_accum_steps=2, dp_rank=0, dp_size=1, **kw)
    ranks = [PackedLoader(seqs, grad_accum_steps=1, dp_rank=r, dp_size=2, **kw) for r in (0, 1)]
    for _ in range(15):  # 64 // 6 = 10 steps per epoch: crosses an epoch boundary
        s0, s1 = _ids(single.next_microbatch()), _ids(single.next_microbatch())
        assert s0 == _ids(ranks[0].next_microbatch())
        assert s1 == _ids(ranks[1].next_microbatch())
    # explicit offsets for one global batch of a 2-rank, 2-accum setup
    perm = torch.randperm(64, generator=torch.Generator().manual_seed(7)).tolist()
    for r in (0, 1):
        ld = PackedLoader(seqs, grad_accum_steps=2, dp_rank=r, dp_size=2, **kw)
        for a in (0, 1):
            off = a * 2 * 3 + r * 3
            assert _ids(ld.next_microbatch()) == perm[off : off + 3]


def test_seed_determinism_and_epochs() -> None:
    seqs = _seqs(20)

    def take(seed: int, k: int) -> list[list[int]]:
        ld = PackedLoader(
            seqs, micro_batch_size=4, grad_accum_steps=1, dp_rank=0, dp_size=1, seed=seed
        )
        return [_ids(ld.next_microbatch()) for _ in range(k)]

    assert take(1, 6) == take(1, 6)
    assert take(1, 6) != take(2, 6)
    first_epoch = take(1, 5)
    assert sorted(sum(first_epoch, [])) == list(range(20))  # an epoch covers everything once


def test_remainder_dropped() -> None:
    ld = PackedLoader(
        _seqs(10), micro_batch_size=4, grad_accum_steps=1, dp_rank=0, dp_size=1, seed=0
    )
    e0 = _ids(ld.next_microbatch()) + _ids(ld.next_microbatch())
    perm0 = torch.randperm(10, generator=torch.Generator().manual_seed(0)).tolist()
    perm1 = torch.randperm(10, generator=torch.Generator().manual_seed(1)).tolist()
    assert e0 == perm0[:8]
    assert _ids(ld.next_microbatch()) == perm1[:4] and ld.epoch == 1


@pytest.mark.parametrize("k", [1, 3, 4, 7])  # 13 seqs / 4 per step -> 3 steps per epoch
def test_exact_resume(k: int) -> None:
    seqs = _seqs(26)
    kw = {"micro_batch_size": 2, "grad_accum_steps": 2, "dp_rank": 1, "dp_size": 2, "seed": 5}
    ref = PackedLoader(seqs, **kw)
    a = PackedLoader(seqs, **kw)
    for _ in range(k * 2):
        ref.next_microbatch()
        a.next_microbatch()
    state = json.loads(json.dumps(a.state_dict()))
    b = PackedLoader(seqs, **kw)
    b.load_state_dict(state)
    for _ in range(10):
        assert _ids(ref.next_microbatch()) == _ids(b.next_microbatch())
    with pytest.raises(UserError, match="train sequences"):
        PackedLoader(_seqs(30), **kw).load_state_dict(state)


def test_eval_batches_sharded() -> None:
    val = _seqs(10)
    r0 = eval_batches(val, 2, 0, 2, max_batches=None)
    r1 = eval_batches(val, 2, 1, 2, max_batches=None)
    assert len(r0) == len(r1) == 2
    assert [_ids(b) for b in r0] == [[0, 1], [4, 5]] and [_ids(b) for b in r1] == [[2, 3], [6, 7]]
    assert eval_batches(val, 2, 0, 1, max_batches=None)[0][0].shape == (2, 5)
    assert len(eval_batches(val, 2, 0, 2, max_batches=1)) == 1
    tiny = eval_batches(_seqs(1), 2, 1, 2, max_batches=4)  # wraps so every rank has one batch
    assert len(tiny) == 1 and _ids(tiny[0]) == [0, 0]


def test_hf_tokenizer_json(tmp_path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"[UNK]": 0, "hello": 1, "world": 2, "<|endoftext|>": 3}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    path = tmp_path / "tokenizer.json"
    tk.save(str(path))
    tok = load_tokenizer(str(path))
    assert tok.vocab_size == 4 and tok.eos_id == 3
    assert tok.encode("hello world zzz").tolist() == [1, 2, 0]
    assert load_tokenizer(str(tmp_path)).eos_id == 3  # a directory holding tokenizer.json
    (tmp_path / "c.txt").write_text("hello world hello")
    b = build_data(str(tmp_path / "c.txt"), str(path), "text", 1, 0.0, None)
    assert b.train.tolist() == [[1, 2], [1, 3]] and len(b.val) == 0

    del vocab["<|endoftext|>"]
    tk2 = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tk2.pre_tokenizer = pre_tokenizers.Whitespace()
    tk2.save(str(tmp_path / "noeos.json"))
    tok2 = load_tokenizer(str(tmp_path / "noeos.json"))
    assert tok2.eos_id is None
    assert tokenize_stream(["hello", "world"], tok2).tolist() == [1, 2]


def test_too_small_dataset(tmp_path) -> None:
    p = tmp_path / "tiny.txt"
    p.write_text("x" * 200)
    b = build_data(str(p), "byte", "text", 15, 0.1, None)
    assert len(b.train) + len(b.val) == 201 // 16
    with pytest.raises(UserError, match=r"only 11 training rows.*needs 16"):
        PackedLoader(b.train, micro_batch_size=4, grad_accum_steps=2, dp_rank=0, dp_size=2, seed=0)
    with pytest.raises(UserError, match="not one sequence"):
        build_data(str(p), "byte", "text", 500, 0.1, None)
