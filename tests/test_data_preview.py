"""`zerofit data preview`: the rows a run trains on, decoded with the loss tokens marked, counts
that agree with the data, a self-contained escaped HTML page, a length histogram, text data,
and one-line errors."""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest
import yaml
from sft_helpers import CHAT, write_chat_jsonl

from zerofit.cli import main
from zerofit.data import (
    ByteTokenizer,
    SampleOptions,
    iter_sample_records,
    load_tokenizer,
    render_samples,
)
from zerofit.launch.run_config import load_config

HOSTILE = [
    {"role": "user", "content": "<script>alert(1)</script> héllo 日本"},
    {"role": "assistant", "content": "no <b>way</b> é"},
]


def _chat_config(tmp: Path, tok_dir: Path, first: list[dict], n: int = 30, **data) -> Path:
    """CHAT-like records: ``first``, then ``n`` random conversations; seq_len 64."""
    source = write_chat_jsonl(tmp / "chat.jsonl", n, seed=1)
    lines = source.read_text()
    source.write_text(json.dumps({"messages": first}) + "\n" + lines)
    cfg = {
        "model": {"preset": "tiny", "seq_len": 64},
        "data": {"format": "chat", "source": str(source), "tokenizer": str(tok_dir), **data},
    }
    path = tmp / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _preview(tmp: Path, capsys: pytest.CaptureFixture, *args: str) -> tuple[int, str, str]:
    code = main(["data", "preview", "--out", str(tmp / "out"), *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


class _Tokens(HTMLParser):
    """The page's token spans: (classes, text) in order, and all the page's text."""

    def __init__(self) -> None:
        super().__init__()
        self.tokens: list[tuple[set[str], str]] = []
        self.text: list[str] = []
        self._open: set[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        classes = set((dict(attrs).get("class") or "").split())
        self._open = (
            classes if tag == "span" and "t" in classes and "title" in dict(attrs) else None
        )
        if self._open is not None:
            self.tokens.append((self._open, ""))

    def handle_endtag(self, tag: str) -> None:
        self._open = None

    def handle_data(self, data: str) -> None:
        self.text.append(data)
        if self._open is not None:
            classes, text = self.tokens[-1]
            self.tokens[-1] = (classes, text + data)


def _page(out: Path) -> _Tokens:
    parser = _Tokens()
    parser.feed((out / "preview.html").read_text(encoding="utf-8"))
    return parser


def _loss_runs(page: _Tokens) -> list[str]:
    runs, current = [], ""
    for classes, text in page.tokens:
        if "loss" in classes:
            current += text
        elif current:
            runs, current = [*runs, current], ""
    return runs + ([current] if current else [])


def _count(out: str, label: str) -> str:
    found = re.search(rf"[│|] {re.escape(label)}\s+[│|]\s+(.+?) [│|]", out)  # rich or markdown
    assert found, f"no {label!r} in:\n{out}"
    return found.group(1).strip()


def test_html_marks_exactly_the_assistant_turns(
    tmp_path: Path, tok_dir: Path, capsys: pytest.CaptureFixture
) -> None:
    cfg = _chat_config(tmp_path, tok_dir, CHAT, val_fraction=0)
    code, out, err = _preview(tmp_path, capsys, "-c", str(cfg))
    assert code == 0, err
    page = _page(tmp_path / "out")
    runs = _loss_runs(page)
    assert runs[:2] == ["cat red<|im_end|>↵\n", "three two one<|im_end|>↵\n"]  # sample 1
    context = "".join(text for classes, text in page.tokens if "loss" not in classes)
    assert "red cat" in context and "one two three" in context
    assert not any("red cat" in r or "one two" in r or "assistant" in r for r in runs)
    specials = [text for classes, text in page.tokens if "sp" in classes]
    assert "<|im_start|>" in specials and "<|im_end|>" in specials


def test_counts_agree_with_the_data(
    tmp_path: Path, tok_dir: Path, capsys: pytest.CaptureFixture
) -> None:
    cfg = _chat_config(tmp_path, tok_dir, CHAT, n=40)  # val_fraction 0.02: one val row
    code, out, err = _preview(tmp_path, capsys, "-c", str(cfg))
    assert code == 0, err
    source = tmp_path / "chat.jsonl"
    tok = load_tokenizer(str(tok_dir))
    fields = SampleOptions("chat").fields()
    records = iter_sample_records(str(source))
    samples = list(render_samples(records, tok, "chat", fields, "completion", str(tok_dir)))
    lengths = [len(s.ids) for s in samples]
    assert _count(out, "samples") == str(len(source.read_text().splitlines())) == "41"
    assert _count(out, "tokens read") == f"{sum(lengths):,}"
    loss = sum(int(s.mask[1:].sum()) for s in samples)
    assert _count(out, "loss tokens").startswith(f"{loss:,} (")
    spread = _count(out, "sample length min/median/p95/max").split(" / ")
    assert [spread[0], spread[3]] == [str(min(lengths)), str(max(lengths))]
    assert spread[1] == str(round(float(np.median(lengths))))
    train, val = (int(x) for x in _count(out, "packed rows (train / val)").split(" / "))
    assert val == 1 and train > 1
    assert _count(out, "truncated samples").startswith("0 ")


def test_truncated_samples_are_counted_at_their_full_length(
    tmp_path: Path, tok_dir: Path, capsys: pytest.CaptureFixture
) -> None:
    cfg = _chat_config(tmp_path, tok_dir, CHAT, n=40)
    code, out, err = _preview(tmp_path, capsys, "-c", str(cfg), "--model.seq_len", "24")
    assert code == 0, err
    tok = load_tokenizer(str(tok_dir))
    fields = SampleOptions("chat").fields()
    records = iter_sample_records(str(tmp_path / "chat.jsonl"))
    lengths = [len(s.ids) for s in render_samples(records, tok, "chat", fields, "completion", "")]
    over = sum(n > 25 for n in lengths)
    assert over > 0
    assert _count(out, "truncated samples").startswith(f"{over} (")
    assert _count(out, "sample length min/median/p95/max").endswith(f" / {max(lengths)}")


def test_plain_output_brackets_the_loss_tokens(
    tmp_path: Path, tok_dir: Path, capsys: pytest.CaptureFixture
) -> None:
    cfg = _chat_config(tmp_path, tok_dir, CHAT, val_fraction=0)
    code, out, err = _preview(tmp_path, capsys, "-c", str(cfg), "--rows", "1", "--tokens", "30")
    assert code == 0, err
    assert "\x1b[" not in out  # not a terminal: no colour codes
    assert "[[cat red<|im_end|>↵]]" in out
    assert "red cat<|im_end|>↵" in out and "[[red cat" not in out
    assert "train row 1 of" in out and "train row 2 of" not in out
    assert re.search(r"\.\.\. \d+ more tokens in this row", out)  # 30 tokens shown


def test_untrusted_text_is_escaped_and_the_histogram_is_a_png(
    tmp_path: Path, tok_dir: Path, capsys: pytest.CaptureFixture
) -> None:
    hostile_dir = tmp_path / "<script>x"  # the config's path is on the page too
    hostile_dir.mkdir()
    cfg = _chat_config(hostile_dir, tok_dir, HOSTILE, val_fraction=0)
    code, out, err = _preview(tmp_path, capsys, "-c", str(cfg))
    assert code == 0, err
    raw = (tmp_path / "out" / "preview.html").read_text(encoding="utf-8")
    assert "<script" not in raw and "<b>" not in raw and "&lt;script&gt;x" in raw
    spans = re.findall(r'<span class="t[^"]*" title="[^"]*">([^<]*)</span>', raw)
    assert len(spans) > 40 and "&lt;" in spans and "&gt;" in spans  # tokens "<" and ">"
    page = _page(tmp_path / "out")
    shown = "".join(text for _, text in page.tokens)
    assert "<script>alert(1)</script> héllo 日本" in shown  # as text, characters whole
    assert "no <b>way</b> é<|im_end|>↵\n" in _loss_runs(page)
    png = tmp_path / "out" / "lengths.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 1000
    from PIL import Image

    with Image.open(png) as im:
        assert im.format == "PNG" and im.size[0] > 100 and im.size[1] > 100
    assert f"wrote {tmp_path / 'out' / 'preview.html'}" in out


def test_text_format_trains_on_every_token(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    docs = ["the quick brown fox " * (5 + 3 * i) for i in range(12)]
    (tmp_path / "docs.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    args = ["--data.source", str(tmp_path / "docs.jsonl"), "--data.tokenizer", "byte"]
    args += ["--model.seq_len", "128", "--data.val_fraction", "0"]
    code, out, err = _preview(tmp_path, capsys, *args)
    assert code == 0, err
    assert "no masks; every token is a loss target" in " ".join(out.split())
    assert "[[" not in out
    lengths = [len(d.encode()) + 1 for d in docs]  # each with its EOS
    assert _count(out, "documents") == "12"
    rows = sum(lengths) // 129
    assert _count(out, "loss tokens").startswith(f"{rows * 128:,} (100.0%")
    assert _count(out, "document length min/median/p95/max").endswith(f" / {max(lengths)}")
    assert (tmp_path / "out" / "lengths.png").stat().st_size > 1000
    runs = _loss_runs(_page(tmp_path / "out"))
    assert runs and runs[0].startswith("he quick brown fox")  # all but the row's first token


def test_bad_input_is_one_line_and_exit_2(
    tmp_path: Path, tok_dir: Path, capsys: pytest.CaptureFixture
) -> None:
    cfg = _chat_config(tmp_path, tok_dir, CHAT)
    missing = str(tmp_path / "missing.jsonl")
    code, out, err = _preview(tmp_path, capsys, "-c", str(cfg), "--data.source", missing)
    assert code == 2 and err == f"error: data source not found: {missing}\n", err
    assert not (tmp_path / "out" / "preview.html").exists()
    code, _, err = _preview(tmp_path, capsys, "-c", str(cfg), "--rows", "-1")
    assert code == 2 and len(err.splitlines()) == 1 and "--rows" in err
    (tmp_path / "file").write_text("")
    code, _, err = _preview(tmp_path, capsys, "-c", str(cfg), "--out", str(tmp_path / "file"))
    assert code == 2 and len(err.splitlines()) == 1 and "--out" in err


def test_preview_builds_the_data_as_training_does(
    tmp_path: Path, tok_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both build through `zerofit.train.inputs.run_data`: the same `build_data` call, so they cannot
    disagree (a preview that built its own way would not reach the patched call)."""
    import zerofit.data.preview as preview
    import zerofit.train.inputs as inputs

    calls = []

    class Stop(Exception):
        pass

    def record(*args: object, **kwargs: object) -> None:
        calls.append((args, kwargs))
        raise Stop

    monkeypatch.setattr(inputs, "build_data", record)
    for overrides in ([], ["data.train_on=all", "data.packing=false", "data.overlong=drop"]):
        cfg = load_config(_chat_config(tmp_path, tok_dir, CHAT), overrides)
        for build in (inputs.build_inputs, preview.build_preview):
            with pytest.raises(Stop):
                build(cfg)
        assert calls[-1] == calls[-2]


def test_pieces_are_readable() -> None:
    from zerofit.data.preview import readable_pieces, special_tokens, visible

    tok = ByteTokenizer()
    text = "a\tb\né日本"
    ids = [*tok.encode(text).tolist(), 256]
    pieces = readable_pieces(tok, ids, special_tokens(tok))
    assert len(pieces) == len(ids) and pieces[-1] == "<eos>"
    assert "".join(pieces[:-1]) == text and "\ufffd" not in "".join(pieces)
    assert visible(text) == "a⇥b↵\né日本"
