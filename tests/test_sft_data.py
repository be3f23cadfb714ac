"""Fine-tuning data: chat and prompt/completion samples, loss masks, document-separated packing,
overlong samples, record sources, the built-in Llama's document attention, and bad input."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import TINY, deep_update, write_config, zerofit
from sft_helpers import CHAT, make_tokenizer

from zerofit.cli import main
from zerofit.data import (
    IGNORE_INDEX,
    ByteTokenizer,
    ChatRenderer,
    PackedLoader,
    Sample,
    SampleOptions,
    build_data,
    first_fit,
    fit_samples,
    iter_documents,
    iter_sample_records,
    load_tokenizer,
    pack_samples,
    prompt_completion_sample,
    real_tokens,
    to_batch,
)
from zerofit.errors import UserError
from zerofit.launch.run_config import config_from_dict
from zerofit.models.llama import Llama, rope_table
from zerofit.models.presets import PRESETS
from zerofit.train.inputs import data_meta


def _runs(mask: np.ndarray) -> list[tuple[int, int]]:
    """[start, end) of each run of True."""
    edges = np.flatnonzero(np.diff(np.concatenate([[0], mask.astype(int), [0]])))
    return list(zip(edges[::2].tolist(), edges[1::2].tolist(), strict=True))


def test_chat_ids_are_apply_chat_template_and_loss_is_on_assistant_turns(tok_dir: Path) -> None:
    tok = load_tokenizer(str(tok_dir))
    renderer = ChatRenderer(tok, str(tok_dir))
    sample = renderer.sample({"messages": CHAT}, "f:1", "messages", "completion")
    expected = tok.hf.apply_chat_template(CHAT, tokenize=True)
    expected = expected["input_ids"] if hasattr(expected, "keys") else expected
    assert sample.ids.tolist() == list(expected)
    trained = [tok.decode(sample.ids[a:b]) for a, b in _runs(sample.mask)]
    assert trained == ["cat red<|im_end|>\n", "three two one<|im_end|>\n"]  # no role header
    every = renderer.sample({"messages": CHAT}, "f:1", "messages", "all")
    assert every.ids.tolist() == sample.ids.tolist() and every.mask.all()


def test_prompt_completion_sample(tok_dir: Path) -> None:
    tok = load_tokenizer(str(tok_dir))  # a folder: AutoTokenizer's ids, its own eos_token
    obj = {"prompt": "red cat", "completion": " dog"}
    s = prompt_completion_sample(tok, obj, "f:1", ("prompt", "completion"), "completion")
    prompt = tok.hf("red cat", add_special_tokens=False)["input_ids"]
    completion = tok.hf(" dog", add_special_tokens=False)["input_ids"]
    assert s.ids.tolist() == [*prompt, *completion, tok.hf.convert_tokens_to_ids("</s>")]
    assert s.mask.tolist() == [False] * len(prompt) + [True] * (len(completion) + 1)
    obj = {"prompt": "ab", "completion": "cd"}
    s = prompt_completion_sample(
        ByteTokenizer(), obj, "f:1", ("prompt", "completion"), "completion"
    )
    assert s.ids.tolist() == [97, 98, 99, 100, 256]
    assert s.mask.tolist() == [False, False, True, True, True]
    s = prompt_completion_sample(ByteTokenizer(), obj, "f:1", ("prompt", "completion"), "all")
    assert s.mask.all()


def _sample(n: int, where: str = "f:1", first_target: int = 1) -> Sample:
    mask = np.zeros(n, dtype=bool)
    mask[first_target:] = True
    return Sample(np.arange(10, 10 + n, dtype=np.int32), mask, where)


def test_first_fit_packing_keeps_documents_apart() -> None:
    samples = [_sample(5), _sample(9), _sample(3), _sample(4, first_target=2)]
    assert first_fit([4, 8, 2, 3], 10) == [0, 1, 0, 0]
    rows, fill = pack_samples(samples, 10, packing=True)
    assert rows.shape == (2, 3, 10) and fill == pytest.approx(17 / 20)
    inputs, targets, positions = rows[0]
    assert positions.tolist() == [0, 1, 2, 3, 0, 1, 0, 1, 2, 0]  # s0, s2, s3, one pad
    assert inputs[:4].tolist() == [10, 11, 12, 13] and inputs[4:6].tolist() == [10, 11]
    assert targets[:4].tolist() == [11, 12, 13, 14]
    # s3: token 1 is not a target (first_target=2), padding has none
    assert targets[6:].tolist() == [IGNORE_INDEX, 12, 13, IGNORE_INDEX]
    assert rows[1, 2].tolist() == [*range(8), 0, 1] and (rows[1, 1, 8:] == IGNORE_INDEX).all()
    alone, _ = pack_samples(samples, 10, packing=False)
    assert alone.shape == (4, 3, 10) and alone[3, 2, :3].tolist() == [0, 1, 2]


def test_real_tokens_count_sample_places_not_padding() -> None:
    """Places holding sample tokens, wherever their targets are: s3's start late, and s4 (last in
    row 0) ends with places that carry no loss; padding after it does not count."""
    tail = _sample(4)
    tail.mask[2:] = False  # targets only for its 2nd token: its last 2 places carry no loss
    samples = [_sample(5), _sample(9), _sample(3, first_target=2), tail, _sample(6)]
    rows, _ = pack_samples(samples, 10, packing=True)  # places 4, 8, 2, 3, 5 -> rows 0, 1, 0, 0, 2
    assert rows[0, 1, 6:9].tolist() == [11, IGNORE_INDEX, IGNORE_INDEX]  # s4's loss, then none
    assert [real_tokens(to_batch(rows[i : i + 1])) for i in range(3)] == [9, 8, 5]
    assert real_tokens(to_batch(rows)) == 22
    assert real_tokens(to_batch(np.arange(22).reshape(2, 11))) == 20  # text rows: every place


def test_overlong_truncate_drop_error() -> None:
    samples = [_sample(4), _sample(9, "long.jsonl:7"), _sample(8, first_target=7)]
    kept, stats = fit_samples(samples, 5, "truncate")  # fits: at most 6 tokens
    assert [len(s.ids) for s in kept] == [4, 6]  # the third has no target left: skipped
    assert (stats.truncated_samples, stats.truncated_tokens, stats.skipped_samples) == (2, 5, 1)
    kept, stats = fit_samples(samples, 5, "drop")
    assert [len(s.ids) for s in kept] == [4]
    assert (stats.dropped_samples, stats.dropped_tokens, stats.truncated_samples) == (2, 17, 0)
    with pytest.raises(UserError, match=r"^long\.jsonl:7: sample of 9 tokens is longer"):
        fit_samples(samples, 5, "error")


def test_record_sources_agree(tmp_path: Path) -> None:
    pq = pytest.importorskip("pyarrow.parquet")
    import pyarrow as pa

    records = [{"prompt": f"p{i}", "completion": f"c{i}", "text": f"doc {i}"} for i in range(5)]
    d = tmp_path / "d"
    d.mkdir()
    (d / "a.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records[:2]))
    (d / "b.json").write_text(json.dumps(records[2:4]))
    pq.write_table(pa.Table.from_pylist(records[4:]), str(d / "c.parquet"))
    got = list(iter_sample_records(str(d)))
    assert [r for r, _ in got] == records
    assert [w.rsplit("/", 1)[-1] for _, w in got] == [
        "a.jsonl:1",
        "a.jsonl:2",
        "b.json: record 1",
        "b.json: record 2",
        "c.parquet: row 1",
    ]
    assert list(iter_documents(str(d / "c.parquet"))) == ["doc 4"]
    (d / "bad.json").write_text('{"not": "a list"}')
    with pytest.raises(UserError, match="must hold a list of records"):
        list(iter_sample_records(str(d / "bad.json")))


def test_build_data_rows_report_and_resume(tmp_path: Path) -> None:
    src = tmp_path / "pc.jsonl"
    lines = [{"prompt": "q" * (3 + i % 5), "completion": "a" * (2 + i % 7)} for i in range(60)]
    lines.append({"prompt": "x" * 40, "completion": "y"})  # 42 tokens: truncated to 17
    src.write_text("".join(json.dumps(r) + "\n" for r in lines))
    opts = SampleOptions("prompt_completion")
    b = build_data(str(src), "byte", "text", 16, 0.1, None, samples=opts)
    assert b.masked and b.train.shape[1:] == (3, 16)
    assert b.stats.samples == 61 and b.stats.truncated_samples == 1 and b.stats.skipped_samples == 1
    assert "61 samples" in b.report_line() and "truncated 1 samples (25 tokens)" in b.report_line()
    kw = {"micro_batch_size": 2, "grad_accum_steps": 2, "dp_rank": 1, "dp_size": 2, "seed": 3}
    ref, a = PackedLoader(b.train, **kw), PackedLoader(b.train, **kw)
    for _ in range(5):
        ref.next_microbatch(), a.next_microbatch()
    resumed = PackedLoader(b.train, **kw)
    resumed.load_state_dict(json.loads(json.dumps(a.state_dict())))
    for _ in range(6):
        x, y = ref.next_microbatch(), resumed.next_microbatch()
        assert len(x) == 3 and all(torch.equal(u, v) for u, v in zip(x, y, strict=True))


def test_checkpoint_meta_records_the_format() -> None:
    text = config_from_dict(deep_update(TINY, {}))
    assert data_meta(text) == {"source": "stdlib", "tokenizer": "byte"}  # as before: resumable
    chat = config_from_dict(deep_update(TINY, {"data": {"format": "chat", "packing": False}}))
    assert data_meta(chat)["format"] == "chat" and data_meta(chat)["packing"] is False


# ----------------------------------------------------------------------------- the model


def _model() -> Llama:
    torch.manual_seed(0)
    model = Llama(replace(PRESETS["tiny"], n_layers=2))
    for p in model.parameters():
        if p.dim() == 2:
            torch.nn.init.normal_(p, std=0.05)
    return model.float()


def test_packed_batch_gives_each_document_its_own_loss() -> None:
    model, g = _model(), torch.Generator().manual_seed(1)
    docs = [torch.randint(0, 512, (n,), generator=g) for n in (7, 12, 5, 9)]
    rows = [docs[:3], docs[3:]]  # two rows: 24 and 9 tokens (+ padding)
    tokens = torch.zeros(2, 32, dtype=torch.long)
    positions = torch.zeros(2, 32, dtype=torch.long)
    spans = []
    for r, row in enumerate(rows):
        o = 0
        for d in row:
            tokens[r, o : o + len(d)] = d
            positions[r, o : o + len(d)] = torch.arange(len(d))
            spans.append((r, o, len(d)))
            o += len(d)
        positions[r, o:] = torch.arange(32 - o)
    for (r, o, n), doc in zip(spans, docs, strict=True):
        targets = torch.full_like(tokens, IGNORE_INDEX)
        targets[r, o : o + n - 1] = doc[1:]
        with torch.no_grad():
            packed = model(tokens, targets, positions=positions)
            alone = model(doc[None, :-1], doc[None, 1:])
        assert packed.item() == pytest.approx(alone.item(), rel=1e-5, abs=1e-6)


def test_rope_uses_the_positions() -> None:
    """RoPE is relative, so per-document losses cannot show it: check the table itself."""
    positions = torch.tensor([[0, 1, 2, 0, 1, 0], [0, 1, 2, 3, 4, 5]])
    table = rope_table(64, 6, 10000.0, torch.device("cpu"), positions)
    plain = rope_table(64, 6, 10000.0, torch.device("cpu"))
    assert table.shape == (2, 2, 1, 6, 64)
    for b in range(2):
        assert torch.equal(table[:, b, 0], plain[:, positions[b]])
    model, seen = _model(), {}
    model.layers[0].register_forward_pre_hook(lambda m, args: seen.update(rope=args[1]))
    with torch.no_grad():
        model(torch.zeros(2, 6, dtype=torch.long), positions=positions)
    expected = rope_table(
        model.args.head_dim, 6, model.args.rope_theta, torch.device("cpu"), positions
    )
    assert torch.equal(seen["rope"], expected)  # the blocks get the positions' table


def test_masked_targets_get_exactly_zero_gradient() -> None:
    model = _model()
    tokens = torch.randint(0, 512, (2, 16), generator=torch.Generator().manual_seed(2))
    targets = tokens.roll(-1, dims=1)
    masked = torch.zeros_like(tokens, dtype=torch.bool)
    masked[0, :6] = masked[1, 9:] = True
    targets[masked] = IGNORE_INDEX
    positions = torch.cat([torch.arange(10), torch.arange(6)]).expand(2, 16)
    seen = {}
    model.output.register_forward_hook(lambda m, args, out: seen.update(h=args[0]))
    loss = model(tokens, targets, positions=positions)
    seen["h"].retain_grad()  # the output layer's input: one vector per target
    loss.backward()
    grad = seen["h"].grad
    assert (grad[masked] == 0).all()  # exactly zero where no loss falls
    assert (grad[~masked].abs().sum(-1) > 0).all()


def test_one_document_with_positions_is_the_causal_model() -> None:
    model = _model()
    tokens = torch.randint(0, 512, (2, 20), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        plain = model(tokens)
        same = model(tokens, positions=torch.arange(20).expand(2, 20))
    torch.testing.assert_close(same, plain, rtol=1e-5, atol=1e-6)


# ----------------------------------------------------------------------------- bad input


def _chat_config(tmp: Path, tok: Path, records: list[dict], **data: object) -> Path:
    src = tmp / "chat.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in records))
    extra = {"data": {"source": str(src), "format": "chat", "tokenizer": str(tok), **data}}
    return write_config(tmp / "c.yaml", deep_update(extra, {"log": {"run_dir": str(tmp / "r")}}))


GOOD = {"messages": CHAT[1:3]}
BAD_INPUT = {
    "missing_field": ([GOOD, {"msgs": CHAT}], {}, r"chat\.jsonl:2: no field 'messages'"),
    "unknown_role": (
        [GOOD, GOOD, {"messages": [{"role": "tool", "content": "x"}]}],
        {},
        r"chat\.jsonl:3: the chat template refused this conversation: unknown role: tool",
    ),
    "no_template": ([GOOD], {}, r"needs a tokenizer folder with a chat template"),
}


@pytest.mark.parametrize("case", list(BAD_INPUT))
def test_bad_input_is_one_line(case: str, tmp_path: Path, tok_dir: Path, capsys) -> None:
    records, data, pattern = BAD_INPUT[case]
    tok = (
        make_tokenizer(tmp_path / "plain", chat_template=None) if case == "no_template" else tok_dir
    )
    cfg = _chat_config(tmp_path, tok, records, **data)
    code = main(["train", "-c", str(cfg)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and err.startswith("error: "), err
    assert re.search(pattern, err), err
    assert not (tmp_path / "r").exists()


def test_overlong_error_through_the_cli(tmp_path: Path, tok_dir: Path) -> None:
    long = {"messages": [{"role": "user", "content": "red " * 40}, CHAT[2]]}
    cfg = _chat_config(tmp_path, tok_dir, [GOOD, GOOD, long], overlong="error")
    proc = zerofit("train", "-c", str(cfg), cwd=tmp_path)
    err = proc.stderr.strip()
    assert proc.returncode == 2 and len(err.splitlines()) == 1, err
    assert "chat.jsonl:3: sample of" in err and "longer than model.seq_len + 1 = 65" in err, err
