"""ShareGPT and Alpaca records: read as chats / prompt + completion, field and role names from the
config, and an error line (file:line, the role or field, the config key that fixes it) for what
cannot be read, never a silent skip."""

from __future__ import annotations

import random
import re
from pathlib import Path

import numpy as np
import pytest
from conftest import TINY, deep_update, write_config
from sft_helpers import conversation, write_jsonl

from zerofit.cli import main
from zerofit.data import (
    ByteTokenizer,
    ChatRenderer,
    SampleOptions,
    build_data,
    iter_sample_records,
    load_tokenizer,
    render_samples,
)
from zerofit.errors import UserError
from zerofit.launch.run_config import config_from_dict
from zerofit.train.inputs import sample_options

TO_SHAREGPT = {"system": "system", "user": "human", "assistant": "gpt"}


def _chats(n: int) -> list[list[dict]]:
    rng = random.Random(7)
    return [conversation(rng) for _ in range(n)]


def _as_sharegpt(msgs: list[dict], i: int) -> dict:
    """Every fourth record with its system prompt as the top-level `system` field."""
    if i % 4 == 0 and msgs[0]["role"] == "system":
        rest = [{"from": TO_SHAREGPT[m["role"]], "value": m["content"]} for m in msgs[1:]]
        return {"system": msgs[0]["content"], "conversations": rest}
    return {
        "conversations": [{"from": TO_SHAREGPT[m["role"]], "value": m["content"]} for m in msgs]
    }


def _samples(path: Path, tok_dir: Path, opts: SampleOptions) -> list:
    tok = load_tokenizer(str(tok_dir))
    records = iter_sample_records(str(path))
    return list(
        render_samples(
            records,
            tok,
            opts.format,
            opts.fields(),
            opts.train_on,
            str(tok_dir),
            None,
            opts.role_map(),
        )
    )


def _runs(mask: np.ndarray) -> list[tuple[int, int]]:
    edges = np.flatnonzero(np.diff(np.concatenate([[0], mask.astype(int), [0]])))
    return list(zip(edges[::2].tolist(), edges[1::2].tolist(), strict=True))


def _same(a: list, b: list) -> None:
    assert len(a) == len(b) > 0
    for x, y in zip(a, b, strict=True):
        assert x.ids.tolist() == y.ids.tolist() and x.mask.tolist() == y.mask.tolist()


def test_sharegpt_is_the_chat_it_holds(tmp_path: Path, tok_dir: Path) -> None:
    chats = _chats(12)
    systems = [i % 4 for i, c in enumerate(chats) if c[0]["role"] == "system"]
    assert 0 in systems and any(systems)  # a top-level system, and one in the turns
    chat = write_jsonl(tmp_path / "chat.jsonl", [{"messages": c} for c in chats])
    share = write_jsonl(tmp_path / "share.jsonl", [_as_sharegpt(c, i) for i, c in enumerate(chats)])
    want = _samples(chat, tok_dir, SampleOptions("chat"))
    got = _samples(share, tok_dir, SampleOptions("sharegpt"))
    _same(got, want)
    tok = load_tokenizer(str(tok_dir))
    for s, msgs in zip(got, chats, strict=True):  # the loss covers the gpt turns, nothing else
        trained = [tok.decode(s.ids[a:b]) for a, b in _runs(s.mask)]
        answers = [m["content"] + "<|im_end|>\n" for m in msgs if m["role"] == "assistant"]
        assert trained == answers
    rows = [
        build_data(str(p), str(tok_dir), "text", 64, 0.0, None, samples=SampleOptions(f))
        for p, f in [(chat, "chat"), (share, "sharegpt")]
    ]
    assert np.array_equal(rows[0].train, rows[1].train)
    assert rows[1].report_line().startswith("data (sharegpt): 12 samples")


def test_custom_field_and_role_names(tmp_path: Path, tok_dir: Path) -> None:
    chats = _chats(6)
    names = {"system": "sys", "user": "person", "assistant": "bot"}
    dialog = [
        {"dialog": [{"speaker": names[m["role"]], "text": m["content"]} for m in c]} for c in chats
    ]
    src = write_jsonl(tmp_path / "custom.jsonl", dialog)
    data = {
        "source": str(src),
        "tokenizer": str(tok_dir),
        "roles": {"sys": "system", "person": "user", "bot": "assistant"},
    }
    columns = {  # by the format's own names, or by chat's
        "chat": {"messages": "dialog", "role": "speaker", "content": "text"},
        "sharegpt": {"conversations": "dialog", "from": "speaker", "value": "text"},
    }
    want = _samples(
        write_jsonl(tmp_path / "c.jsonl", [{"messages": c} for c in chats]),
        tok_dir,
        SampleOptions("chat"),
    )
    for fmt in ("chat", "sharegpt"):  # the config's names, through sample_options
        cfg = {"data": {**data, "format": fmt, "columns": columns[fmt]}}
        _same(_samples(src, tok_dir, sample_options(config_from_dict(cfg))), want)
    bad = SampleOptions("sharegpt", columns=(("speaker", "x"),))
    with pytest.raises(UserError, match=r"data\.columns: 'speaker' is not a field name"):
        _samples(src, tok_dir, bad)


@pytest.mark.parametrize(
    "record, pattern",
    [
        (
            {
                "conversations": [
                    {"from": "human", "value": "red"},
                    {"from": "observation", "value": "x"},
                ]
            },
            r"x\.jsonl:2: message 1 has role 'observation', which data\.format=sharegpt does not map "
            r"\(it maps human, gpt, system, user, assistant\); map it with data\.roles\.observation:",
        ),
        (
            {
                "conversations": [
                    {"from": "human", "value": "red"},
                    {"from": "user", "value": "cat"},
                ]
            },
            r"x\.jsonl:2: no assistant turn: nothing to learn \(roles: user\); map the answering role "
            r"with data\.roles\.<role>: assistant .*data\.train_on=all",
        ),
        (
            {"messages": [{"role": "user", "content": "red"}]},
            r"x\.jsonl:2: no field 'conversations' in this record \(it has: messages\); it looks like "
            r"data\.format=chat",
        ),
    ],
)
def test_unreadable_records_are_errors(
    tmp_path: Path, tok_dir: Path, record: dict, pattern: str
) -> None:
    good = _as_sharegpt(_chats(1)[0], 0)
    src = write_jsonl(tmp_path / "x.jsonl", [good, record, good])
    with pytest.raises(UserError, match=pattern):
        _samples(src, tok_dir, SampleOptions("sharegpt"))


def test_mapped_role_the_template_refuses(tmp_path: Path, tok_dir: Path, capsys) -> None:
    """Mapped to a role ChatML (here) cannot render: one line, the role, the key that maps it."""
    turns = [
        {"from": "human", "value": "red"},
        {"from": "function", "value": "x"},
        {"from": "gpt", "value": "der"},
    ]
    src = write_jsonl(tmp_path / "f.jsonl", [{"conversations": turns}] * 3)
    extra = {
        "data": {
            "source": str(src),
            "format": "sharegpt",
            "tokenizer": str(tok_dir),
            "roles": {"function": "tool"},
        },
        "log": {"run_dir": str(tmp_path / "r")},
    }
    code = main(["train", "-c", str(write_config(tmp_path / "c.yaml", extra))])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert re.search(
        r"f\.jsonl:1: the chat template refused this conversation: unknown role: tool", err
    )
    assert "(roles: user, tool, assistant)" in err and "data.roles.<role>" in err


ALPACA = [
    {"instruction": "reverse red cat", "input": "", "output": "cat red"},
    {"instruction": "reverse", "input": "one two", "output": "two one", "system": "be brief"},
    {"instruction": "say blue", "output": "blue"},  # no input field at all
]


def test_alpaca_with_a_chat_template_is_a_chat(tmp_path: Path, tok_dir: Path) -> None:
    src = write_jsonl(tmp_path / "a.jsonl", ALPACA)
    chats = [
        [
            {"role": "user", "content": "reverse red cat"},
            {"role": "assistant", "content": "cat red"},
        ],
        [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "reverse\n\none two"},
            {"role": "assistant", "content": "two one"},
        ],
        [{"role": "user", "content": "say blue"}, {"role": "assistant", "content": "blue"}],
    ]
    want = _samples(
        write_jsonl(tmp_path / "c.jsonl", [{"messages": c} for c in chats]),
        tok_dir,
        SampleOptions("chat"),
    )
    _same(_samples(src, tok_dir, SampleOptions("alpaca")), want)
    b = build_data(str(src), str(tok_dir), "text", 64, 0.0, None, samples=SampleOptions("alpaca"))
    assert b.report_line().startswith("data (alpaca as chat): 3 samples")


def test_alpaca_without_a_chat_template_is_prompt_completion(tmp_path: Path) -> None:
    src = write_jsonl(tmp_path / "a.jsonl", ALPACA)
    tok = ByteTokenizer()
    opts = SampleOptions("alpaca")
    got = list(
        render_samples(
            iter_sample_records(str(src)), tok, "alpaca", opts.fields(), "completion", "byte"
        )
    )
    prompts = ["reverse red cat\n\n", "be brief\n\nreverse\n\none two\n\n", "say blue\n\n"]
    for s, prompt, rec in zip(got, prompts, ALPACA, strict=True):
        p, c = list(prompt.encode()), list(rec["output"].encode())
        assert s.ids.tolist() == [*p, *c, 256]
        assert s.mask.tolist() == [False] * len(p) + [True] * (len(c) + 1)
    b = build_data(str(src), "byte", "text", 64, 0.0, None, samples=opts)
    assert b.report_line().startswith("data (alpaca as prompt_completion): 3 samples")


def test_alpaca_field_names_and_missing_output(tmp_path: Path) -> None:
    renamed = [{"q": r["instruction"], "ctx": r.get("input"), "a": r["output"]} for r in ALPACA]
    src = write_jsonl(tmp_path / "r.jsonl", renamed)
    cfg = config_from_dict(
        {
            "data": {
                "format": "alpaca",
                "columns": {"instruction": "q", "input": "ctx", "output": "a"},
            }
        }
    )
    opts = sample_options(cfg)
    tok = ByteTokenizer()
    got = list(
        render_samples(
            iter_sample_records(str(src)), tok, "alpaca", opts.fields(), "completion", "byte"
        )
    )
    assert bytes(got[1].ids[:-1].tolist()).decode() == "reverse\n\none two\n\ntwo one"
    bad = write_jsonl(tmp_path / "bad.jsonl", [ALPACA[0], {"instruction": "x", "answer": "y"}])
    with pytest.raises(
        UserError, match=r"bad\.jsonl:2: no field 'output' .*set data\.columns\.output to"
    ):
        list(
            render_samples(
                iter_sample_records(str(bad)),
                tok,
                "alpaca",
                SampleOptions("alpaca").fields(),
                "completion",
                "byte",
            )
        )


def test_chat_renderer_keeps_its_interface(tok_dir: Path) -> None:
    """renderer.sample(record, where, field, train_on), as the preview and older callers use it."""
    tok = load_tokenizer(str(tok_dir))
    msgs = _chats(1)[0]
    s = ChatRenderer(tok, str(tok_dir)).sample({"m": msgs}, "f:1", "m", "completion")
    expected = tok.hf.apply_chat_template(msgs, tokenize=True)
    expected = expected["input_ids"] if hasattr(expected, "keys") else expected
    assert s.ids.tolist() == list(expected) and s.mask.any()


def test_existing_chat_configs_keep_their_defaults() -> None:
    cfg = config_from_dict(deep_update(TINY, {"data": {"format": "chat"}}))
    assert sample_options(cfg).fields()["messages"] == "messages"
    share = config_from_dict(deep_update(TINY, {"data": {"format": "sharegpt"}}))
    assert [sample_options(share).fields()[k] for k in ("messages", "role", "content")] == [
        "conversations",
        "from",
        "value",
    ]
