"""Every benchmark figure in README.md, docs/*.md and docs/benchmarks/*.md matches its raw data
in docs/benchmarks/data/, as rounded in the text.

The convention, in the markdown:

    <!-- data NAME: PATH [PATH ...] -->

PATHs are relative to the markdown file and name the raw data (results.json, *.jsonl, ...);
NAME selects a check in CHECKS below, which reads the same files. The comment goes either

- on its own line right above a table or a paragraph (that table, or the lines down to the next
  blank line); a long one may span lines: `<!-- data NAME:` on the first, then PATH lines, then
  `-->` on the last, right above the table or paragraph; or
- at the end of a line of a paragraph or list item (that paragraph or item; it does not show
  when rendered).

Tables: every table in these files needs a data comment; a table that states no measurement
(a list of options, say) has `<!-- no data: REASON -->` on the line above it instead. A table's
check gives, per row (keyed by the first cell, or the first `key` cells joined by " | "), one entry
per remaining column: a number or a list of numbers (every number in the cell, in order), a
string (the cell's exact text), or `...` (a column that holds no measurement, e.g. a prediction
by hand). Each number in the doc must equal the expected value rounded to the doc's own precision
(decimals, or significant digits for 1.2e-5), so a figure that does not match its JSON fails, and
so does any number the check does not account for.

Paragraphs: the check gives sentences (built from the data) that the text must contain, and
every figure in the text (a number with a decimal point, a thousands comma, or a % or x suffix)
must lie inside one of them. In the README's "Headline figures" section and in
docs/benchmarks.md every paragraph with such a figure needs a data comment.

Every ratio a check computes divides two medians measured in one device call.
"""

from __future__ import annotations

import json
import re
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from doc_checks_dpo import DOC as DPO_DOC
from doc_checks_dpo import DPO_CURVE
from doc_checks_dpo_h100 import DOC as DPO_H100_DOC
from doc_checks_dpo_h100 import DPO_H100, README_DPO
from doc_checks_ds_spy_h100_9 import DOC as DS_SPY_DOC
from doc_checks_ds_spy_h100_9 import DS_SPY_H100_9
from doc_checks_finetune import DOC as FT_DOC
from doc_checks_finetune import FINETUNE
from doc_checks_finetune_fast import DOC as FAST_DOC
from doc_checks_finetune_fast import FINETUNE_FAST, README_FINETUNE_FAST
from doc_checks_first_k import DOC as FK_DOC
from doc_checks_first_k import FIRST_K, INDEX_FIRST_K
from doc_checks_heldout_h100 import DOC as HELDOUT_H100_DOC
from doc_checks_heldout_h100 import HELDOUT_H100
from doc_checks_host_probe_h100 import DOC as HOST_PROBE_DOC
from doc_checks_host_probe_h100 import HOST_PROBE_H100
from doc_checks_host_probe_h100_2 import DOC as HOST_PROBE_2_DOC
from doc_checks_host_probe_h100_2 import HOST_PROBE_H100_2
from doc_checks_host_probe_h100_5 import DOC as HOST_PROBE_5_DOC
from doc_checks_host_probe_h100_5 import HOST_PROBE_H100_5
from doc_checks_host_probe_h100_7 import DOC as HOST_PROBE_7_DOC
from doc_checks_host_probe_h100_7 import HOST_PROBE_H100_7
from doc_checks_nvme import DOC as NVME_DOC
from doc_checks_nvme import NVME, README_NVME
from doc_checks_qlora import DOC as QLORA_DOC
from doc_checks_qlora import QLORA
from doc_checks_qlora4 import DOC as QLORA4_DOC
from doc_checks_qlora4 import QLORA4
from doc_checks_qlora5 import DOC as QLORA5_DOC
from doc_checks_qlora5 import QLORA5
from doc_checks_qlora_kernel import DOC as QLORA_KERNEL_DOC
from doc_checks_qlora_kernel import QLORA_KERNEL
from doc_checks_qlora_kernel_h100 import DOC as QLORA_KERNEL_H100_DOC
from doc_checks_qlora_kernel_h100 import QLORA_KERNEL_H100
from doc_checks_qlora_rebuild import DOC as QLORA_REBUILD_DOC
from doc_checks_qlora_rebuild import QLORA_REBUILD
from doc_checks_qlora_recompute import DOC as QLORA_RECOMPUTE_DOC
from doc_checks_qlora_recompute import QLORA_RECOMPUTE
from doc_checks_qlora_recompute import README_QLORA as README_QLORA_RECOMPUTE
from doc_checks_speed2 import DOC as S2_DOC
from doc_checks_speed2 import INDEX_HELDOUT, INDEX_SPEED2, INDEX_ZERO3, README_8B, SPEED2
from doc_checks_speed2b import DOC as S2B_DOC
from doc_checks_speed2b import INDEX_24GB, INDEX_PLANNER_TODAY, SPEED2B
from doc_checks_timer_h100_8 import DOC as TIMER_8_DOC
from doc_checks_timer_h100_8 import TIMER_H100_8

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "docs" / "benchmarks" / "data"
DOCS = [
    ROOT / "README.md",
    *sorted((ROOT / "docs").glob("*.md")),
    *sorted((ROOT / "docs" / "benchmarks").glob("*.md")),
]
# Where every paragraph with a figure needs a data comment: (doc, its section or None: all of it).
FIGURE_PAGES = [("README.md", "## Headline figures"), ("docs/benchmarks.md", None)]
MIB, GIB = 2**20, 2**30

COMMENT = re.compile(r"(?<!`)<!--\s*data\s+([\w-]+):\s*(.*?)\s*-->", re.DOTALL)
OPENS = re.compile(r"^\s*<!--\s*data\s+[\w-]+:")  # a data comment's first line
NO_DATA = re.compile(r"^\s*<!--\s*no data:\s*\S.*-->\s*$")
NUMBER = re.compile(
    r"(?<![\w.])(?P<sign>[+\-−]?)(?P<whole>\d{1,3}(?:,\d{3})+|\d+)(?P<frac>\.\d+)?"
    r"(?:e(?P<exp>[+-]?\d+))?(?P<suffix>%|x)?(?![\w]|[.,]\d)"
)
ITEM = re.compile(r"\s*(?:[-*]|\d+\.)\s")


# ---------------------------------------------------------------------------------------------
# Reading the markdown


@dataclass
class Block:
    doc: Path
    line: int  # 1-based, first line of the block
    kind: str  # "table" or "text"
    lines: list[str]
    name: str | None = None
    paths: list[Path] = field(default_factory=list)

    def where(self) -> str:
        return f"{self.doc.relative_to(ROOT)}:{self.line}"


def _fenced(lines: list[str]) -> list[bool]:
    inside, out = False, []
    for line in lines:
        if line.strip().startswith("```"):
            inside = not inside
            out.append(True)
        else:
            out.append(inside)
    return out


def _is_table(line: str) -> bool:
    return line.strip().startswith("|")


def _text_end(lines: list[str], start: int, fenced: list[bool], one_item: bool) -> int:
    """Where a paragraph (or, with `one_item`, a list item) that starts at `start` ends."""
    end = start
    while end < len(lines) and lines[end].strip() and not fenced[end]:
        stripped = lines[end].strip()
        if end > start and (
            (one_item and ITEM.match(lines[end])) or stripped.startswith(("|", "<!--", "#"))
        ):
            break
        end += 1
    return end


def _comment_end(doc: Path, lines: list[str], i: int) -> int:
    """The line that closes a data comment opening on line `i` (`i` itself for one line)."""
    if not OPENS.match(lines[i]) or "-->" in lines[i]:
        return i
    end = next((j for j in range(i + 1, len(lines)) if "-->" in lines[j]), None)
    assert end is not None, f"{doc}:{i + 1}: a data comment without its -->"
    return end


def blocks(doc: Path) -> tuple[list[Block], list[Block]]:
    """The data-tagged blocks of a doc, and every table in it (tagged or not)."""
    lines = doc.read_text().splitlines()
    fenced = _fenced(lines)
    tagged, tables, inside = [], [], -1  # inside: the last line of a multi-line comment
    for i, line in enumerate(lines):
        if fenced[i] or i <= inside:
            continue
        if _is_table(line) and (i == 0 or not _is_table(lines[i - 1])):
            if i > 0 and NO_DATA.match(lines[i - 1]):
                continue
            end = i
            while end < len(lines) and _is_table(lines[end]):
                end += 1
            tables.append(Block(doc, i + 1, "table", lines[i:end]))
        last = _comment_end(doc, lines, i)
        text = " ".join(part.strip() for part in lines[i : last + 1])
        m = COMMENT.search(text)
        if not m:
            continue
        inside = last
        paths = [(doc.parent / p).resolve() for p in m.group(2).split()]
        if text == m.group(0):  # on its own line(s): the block right below
            start = last + 1
            if start < len(lines) and _is_table(lines[start]):
                end = start
                while end < len(lines) and _is_table(lines[end]):
                    end += 1
                kind = "table"
            else:
                end, kind = _text_end(lines, start, fenced, one_item=False), "text"
        else:  # at the end of a line: the paragraph or list item holding it
            start = i
            while start > 0 and not ITEM.match(lines[start]) and lines[start - 1].strip():
                start -= 1
            end, kind = _text_end(lines, start, fenced, one_item=True), "text"
            end = max(end, i + 1)
        tagged.append(Block(doc, start + 1, kind, lines[start:end], m.group(1), paths))
    return tagged, tables


def text_of(block: Block) -> str:
    text = COMMENT.sub(" ", " ".join(block.lines)).replace("**", "")
    return re.sub(r"\s+", " ", text).strip()


def cells(row: str) -> list[str]:
    return [c.strip().replace("**", "") for c in row.strip().strip("|").split("|")]


# ---------------------------------------------------------------------------------------------
# Comparing numbers


def _value(m: re.Match) -> float:
    sign = "-" if m["sign"] in ("-", "−") else ""
    text = sign + m["whole"].replace(",", "") + (m["frac"] or "")
    return float(f"{text}e{m['exp']}") if m["exp"] is not None else float(text)


def same(m: re.Match, expected: float) -> bool:
    """True when `expected`, rounded as the doc writes the number, is that number."""
    decimals = len(m["frac"]) - 1 if m["frac"] else 0
    fmt = "e" if m["exp"] is not None else "f"
    return float(f"{expected:.{decimals}{fmt}}") == _value(m)


def is_figure(m: re.Match) -> bool:
    return bool(m["frac"] or "," in m["whole"] or m["suffix"])


def check_table(block: Block, expected: dict[str, list], key: int) -> list[str]:
    errors = []
    header, rows = block.lines[0], block.lines[2:]
    width = len(cells(header)) - key
    for n, row in enumerate(rows, start=block.line + 2):
        parts = cells(row)
        label = " | ".join(parts[:key])
        if label not in expected:
            errors.append(f"line {n}: row {label!r} has no data (known: {sorted(expected)})")
            continue
        want = expected[label]
        assert len(want) == width, f"{block.name}: row {label!r} needs {width} entries"
        for col, (cell, exp) in enumerate(zip(parts[key:], want, strict=True), start=key):
            if exp is ...:
                continue
            if isinstance(exp, str):
                if cell != exp:
                    errors.append(f"line {n}, column {col + 1}: {cell!r}, data says {exp!r}")
                continue
            exp = exp if isinstance(exp, list) else [exp]
            found = list(NUMBER.finditer(cell))
            if len(found) != len(exp):
                errors.append(
                    f"line {n}, column {col + 1}: {cell!r} holds {len(found)} numbers, "
                    f"the data {len(exp)}: {exp}"
                )
                continue
            for m, e in zip(found, exp, strict=True):
                if not same(m, e):
                    errors.append(f"line {n}, column {col + 1}: {m[0]!r}, data says {e!r}")
    return errors


def check_text(block: Block, sentences: list[str]) -> list[str]:
    text, errors, spans = text_of(block), [], []
    for s in sentences:
        at = text.find(s)
        if at < 0:
            errors.append(f"expected {s!r} (from the data) in: {text!r}")
        else:
            spans.append((at, at + len(s)))
    for m in NUMBER.finditer(text):
        if is_figure(m) and not any(a <= m.start() and m.end() <= b for a, b in spans):
            errors.append(f"figure {m[0]!r} is not checked against data in: {text!r}")
    return errors


# ---------------------------------------------------------------------------------------------
# The checks: what each tagged table or paragraph must say, computed from its data


def load(rel: str) -> Any:
    path = DATA / rel
    if path.suffix == ".jsonl":
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return json.loads(path.read_text())


def bench(rel: str) -> dict[str, dict]:
    """A `zerofit bench` results.json, by variant name."""
    return {r["name"]: r for r in load(rel)["results"]}


def pct(x: float) -> float:
    return 100 * x


def sci(x: float, digits: int) -> str:
    """1.7e-5 as the docs write it (no zero-padded exponent)."""
    mantissa, exp = f"{x:.{digits}e}".split("e")
    return f"{mantissa}e{int(exp)}"


def bench_row(r: dict, loss: bool = True) -> list:
    row = [
        r["tokens_per_s"],
        r["tflops_per_gpu"],
        pct(r["mfu"]),
        r["step_time_s"],
        r["mem_alloc_gib"],
        r["mem_reserved_gib"],
    ]
    return [*row, r["final_loss"]] if loss else row


SPEED = "2026-12-02-speed/"
HOUSE8B = "2026-12-03-house-h200/8b/results.json"
FIRST, PAIR, ALL13 = (
    SPEED + f
    for f in ("first-call-8b-results.json", "pair-1b-results.json", "all-13b-results.json")
)
PLANNER = SPEED + "planner.json"
OVERHEAD = "2026-12-03-faults-h200/overhead/"
BEFORE1 = OVERHEAD + "1b-before-1/results.json"
CKPT = "2026-12-02-checkpoints-h200/"
COST, COST_FIRST, RESUME = CKPT + "cost.json", CKPT + "cost-first-run.json", CKPT + "resume.json"
EXPORT = "2026-12-02-export-memory-cpu/"
EXPORTS = {  # file -> how the docs name its checkpoint
    EXPORT + "small.json": "`small`, FSDP",
    EXPORT + "small-dim1024.json": "`small` dim 1024, FSDP",
    EXPORT + "small-deepspeed.json": "`small`, ZeRO-3",
}
PREEMPT = "2026-12-03-faults-h200/preempt.jsonl"
OVERHEADS = [OVERHEAD + f"1b-{w}-{r}/results.json" for r in (1, 2) for w in ("before", "after")]


def planner_rows() -> list[tuple[str, dict, dict | None]]:
    """(label, prediction, measured run or None) for the speed doc's planner table."""
    pred, first, pair = load(PLANNER)["runs"], bench(FIRST), bench(PAIR)
    return [
        (
            "8B FSDP2, bf16 states, fp32 reduce, mbs 1 × 4",
            pred["8b fsdp bf16-states mbs1 ga4"],
            first["fsdp bf16-states mbs1 ga4"],
        ),
        (
            "8B FSDP2, bf16 states, fp32 reduce, mbs 2 × 2",
            pred["8b fsdp bf16-states mbs2 ga2"],
            first["fsdp bf16-states mbs2 ga2"],
        ),
        (
            "8B FSDP2, bf16 states, bf16 reduce, mbs 2 × 2",
            pred["8b fsdp bf16-states bf16-reduce mbs2 ga2"],
            None,
        ),
        (
            "8B ZeRO-3, bf16 states, bf16 reduce, mbs 2 × 2",
            pred["8b zero3 bf16-states bf16-reduce mbs2 ga2"],
            None,
        ),
        (
            "8B FSDP2, fp32 states, full AC, mbs 2 × 2",
            pred["8b fsdp fp32-states AC mbs2 ga2"],
            None,
        ),
        ("1B FSDP2, mbs 8", pred["1b fsdp mbs8"], bench(BEFORE1)["fsdp"]),
        ("1B FSDP2, mbs 8 × 2", pred["1b fsdp mbs8 ga2"], pair["fsdp mbs8 ga2"]),
        ("1B ZeRO-3, mbs 8 × 2", pred["1b zero3 mbs8 ga2"], pair["zero3 mbs8 ga2"]),
        (
            "13B ZeRO-3, optimizer 50% on CPU",
            pred["13b zero3 optim 50% cpu bf16-states"],
            bench(ALL13)["zero3 optim 50% cpu bf16-states"],
        ),
    ]


def err(predicted: float, measured: float) -> float:
    return pct(predicted / measured - 1)


def speed_planner() -> dict[str, list]:
    rows = {}
    for label, p, m in planner_rows():
        mem, tps = p["peak_alloc_gib"], p["tokens_per_s"]
        if m is None:
            rows[label] = [mem, "re-run pending", tps, "re-run pending"]
        elif label == "1B FSDP2, mbs 8":  # its tokens/s were measured in another call: not shown
            rows[label] = [mem, [m["mem_alloc_gib"], err(mem, m["mem_alloc_gib"])], tps, ""]
        else:
            mm, mt = m["mem_alloc_gib"], m["tokens_per_s"]
            rows[label] = [mem, [mm, err(mem, mm)], tps, [mt, err(tps, mt)]]
    return rows


def planning_accuracy() -> list[str]:
    errors = [p["peak_alloc_gib"] / m["mem_alloc_gib"] - 1 for _, p, m in planner_rows() if m]
    within = sum(abs(e) < 0.10 for e in errors)
    return [
        f"Within 10% of measured peak memory on {within} of {len(errors)} H200 runs whose data is kept",
        f"(largest error {pct(max(map(abs, errors))):.1f}%;",
    ]


def speed_8b_first() -> dict[str, list]:
    r = bench(FIRST)
    return {
        "FSDP2, mbs 1 × ga 4": bench_row(r["fsdp bf16-states mbs1 ga4"]),
        "FSDP2, mbs 2 × ga 2": bench_row(r["fsdp bf16-states mbs2 ga2"]),
    }


def speed_8b_first_text() -> list[str]:
    r = bench(FIRST)
    a, b = r["fsdp bf16-states mbs1 ga4"], r["fsdp bf16-states mbs2 ga2"]
    z3, fp32 = r["zero3 bf16-states mbs1 ga4"], r["fsdp fp32-states AC mbs1 ga4"]
    return [
        f"Micro-batch 2 × 2 runs at {b['tokens_per_s'] / a['tokens_per_s']:.3f}x micro-batch 1 × 4 in the same call",
        f"(whole-engine compile) gave {z3['error']}" if z3["status"] == "timeout" else "?",
        "fp32 states and full AC at micro-batch 1 × 4 failed"
        if fp32["status"] == "failed"
        else "?",
        "Target ≥ 11,000 tokens/s",  # the target, not a measurement
    ]


HOUSE = "2026-12-03-house-h200/"


def house_speed() -> dict[str, list]:
    r8, r1 = bench(HOUSE + "8b/results.json"), bench(HOUSE + "1b/results.json")
    r13 = bench(HOUSE + "13b/results.json")
    return {
        "8B FSDP2": bench_row(r8["fsdp bf16-states mbs2 ga2"]),
        "8B ZeRO-3": bench_row(r8["zero3 bf16-states mbs2 ga2"]),
        "1B FSDP2": bench_row(r1["fsdp mbs8 ga2"]),
        "1B ZeRO-3": bench_row(r1["zero3 mbs8 ga2"]),
        "13B ZeRO-3, optimizer 50% on CPU": bench_row(r13["zero3 optim 50% cpu bf16-states"]),
    }


def house_speed_ratio() -> list[str]:
    r8, r1 = bench(HOUSE + "8b/results.json"), bench(HOUSE + "1b/results.json")
    f8, z8 = r8["fsdp bf16-states mbs2 ga2"], r8["zero3 bf16-states mbs2 ga2"]
    f1, z1 = r1["fsdp mbs8 ga2"], r1["zero3 mbs8 ga2"]
    return [
        f"ZeRO-3 runs at {z8['tokens_per_s'] / f8['tokens_per_s']:.3f}x FSDP2 at 8B and at "
        f"{z1['tokens_per_s'] / f1['tokens_per_s']:.3f}x at 1B"
    ]


def speed_1b() -> dict[str, list]:
    r = bench(PAIR)
    return {
        "FSDP2": bench_row(r["fsdp mbs8 ga2"]),
        "DeepSpeed ZeRO-3": bench_row(r["zero3 mbs8 ga2"]),
    }


def speed_1b_text() -> list[str]:
    r = bench(PAIR)
    f, z = r["fsdp mbs8 ga2"], r["zero3 mbs8 ga2"]
    return [
        "Target MFU ≥ 50%",  # the target
        f"missed by {50 - pct(f['mfu']):.1f} points ({pct(f['mfu']):.1f}%)",
        f"ZeRO-3 reaches {z['tokens_per_s'] / f['tokens_per_s']:.3f}x FSDP2 in the same call",
        "target ≥ 0.9x",  # the target
    ]


def speed_misses() -> list[str]:
    pair, first = bench(PAIR), bench(FIRST)
    f, z = pair["fsdp mbs8 ga2"], pair["zero3 mbs8 ga2"]
    eight_b = first["fsdp bf16-states mbs2 ga2"]
    return [
        f"llama3-1b MFU {pct(f['mfu']):.1f}% against a 50% target "
        f"({50 - pct(f['mfu']):.1f} points short)",
        f"The same code reaches {pct(eight_b['mfu']):.1f}% at 8B",
        f"ZeRO-3 trails FSDP2 ({z['tokens_per_s'] / f['tokens_per_s']:.3f}x at 1B in the `pair` call)",
        # the model's shape, not measurements
        "At 2,048 hidden size, the GEMMs are 2–4x smaller",
        "4096 × 2048 × 128,256 GEMMs",
    ]


def speed_13b() -> dict[str, list]:
    r = bench(ALL13)["zero3 optim 50% cpu bf16-states"]
    return {"ZeRO-3, optimizer 50% on CPU": bench_row(r, loss=False)}


def speed_levers() -> dict[str, list]:
    r, pair, meta = bench(FIRST), bench(PAIR), load(FIRST)["meta"]
    a, b = r["fsdp bf16-states mbs1 ga4"], r["fsdp bf16-states mbs2 ga2"]
    z3 = r["zero3 bf16-states mbs1 ga4"]
    timeout = int(re.fullmatch(r"no result within (\d+) s", z3["error"])[1])
    ratio_1b = pair["zero3 mbs8 ga2"]["tokens_per_s"] / pair["fsdp mbs8 ga2"]["tokens_per_s"]
    return {
        "no AC, bf16 states, mbs 1 × ga 4 (8B, fp32 reduction)": [
            ...,
            [a["tokens_per_s"], pct(a["mfu"])],
        ],
        "mbs 2 × ga 2 instead of 1 × 4 (8B)": [
            ...,
            [
                b["tokens_per_s"] / a["tokens_per_s"],
                b["tokens_per_s"],
                b["mem_alloc_gib"],
                b["mem_reserved_gib"],
            ],
        ],
        "fused chunked head + loss (8B, no AC, mbs 2 × ga 2)": [..., [b["mem_alloc_gib"]]],
        "ZeRO-3 compile: whole engine (`engine.compile`)": [
            ...,
            [timeout, meta["warmup"] + meta["steps"]],
        ],
        "ZeRO-3 compile: each block's forward inside DeepSpeed's hooks": [..., [ratio_1b]],
        "DeepSpeed Adam ops prebuilt before timing": [..., []],
    }


def readme_1b() -> list[str]:
    r = bench(PAIR)
    f, z = r["fsdp mbs8 ga2"], r["zero3 mbs8 ga2"]
    return [
        f"FSDP2 runs {f['tokens_per_s']:,.0f} tokens/s ({pct(f['mfu']):.1f}% MFU) and ZeRO-3 "
        f"{z['tokens_per_s']:,.0f} ({pct(z['mfu']):.1f}%), "
        f"{z['tokens_per_s'] / f['tokens_per_s']:.3f}x FSDP2 in the same call",
    ]


def index_speed() -> dict[str, list]:
    b = bench(FIRST)["fsdp bf16-states mbs2 ga2"]
    f, z = bench(PAIR)["fsdp mbs8 ga2"], bench(PAIR)["zero3 mbs8 ga2"]
    t = bench(ALL13)["zero3 optim 50% cpu bf16-states"]
    hf, hz = (
        bench(HOUSE8B)["fsdp bf16-states mbs2 ga2"],
        bench(HOUSE8B)["zero3 bf16-states mbs2 ga2"],
    )
    return {
        "Llama-3-8B shape, seq 4096, no AC, mbs 2 x 2 (2026-12-03)": [
            ...,
            [hf["tokens_per_s"], pct(hf["mfu"])],
            [hz["tokens_per_s"], pct(hz["mfu"]), hz["tokens_per_s"] / hf["tokens_per_s"]],
        ],
        "Llama-3-8B shape, seq 4096, no AC, mbs 2 x 2": [
            ...,
            [b["tokens_per_s"], pct(b["mfu"])],
            "re-run pending",
        ],
        "llama3-1b, seq 2048, mbs 8 x 2": [
            ...,
            [f["tokens_per_s"], pct(f["mfu"])],
            [z["tokens_per_s"], pct(z["mfu"])],
        ],
        "13B, seq 2048, half the optimizer on the CPU": [
            ...,
            "-",
            [t["tokens_per_s"], pct(t["mfu"]), t["mem_alloc_gib"]],
        ],
    }


def verify(threads: int, cold: bool) -> dict:
    return next(v for v in load(COST)["verify"] if v["threads"] == threads and v["cold"] == cold)


def ckpt_verify() -> dict[str, list]:
    labels = {"1": 1, "4": 4, "16 (default: one per core, up to 16)": 16}
    return {
        label: [
            verify(t, True)["s"],
            verify(t, True)["GBps"],
            verify(t, False)["s"],
            verify(t, False)["GBps"],
        ]
        for label, t in labels.items()
    }


def ckpt_size() -> list[str]:
    c = load(COST)
    gb = c["bytes"] / 1e9
    return [
        f"checkpoint is {gb:.2f} GB: one {gb:.1f} GB DCP file plus {c['files'] - 1} small files"
    ]


def ckpt_rates() -> list[str]:
    first = [v["s"] for v in load(COST_FIRST)["verify"]]
    return [
        *(
            f"One core hashes SHA-256 at about {verify(1, c)['GBps']:.1f} GB/s"
            for c in (True, False)
        ),
        f"From the page cache that gives {verify(16, False)['GBps']:.1f} GB/s",
        f"the disk's ~{verify(16, True)['GBps']:.1f} GB/s is the limit",
        f"That took {min(first):.1f}-{max(first):.1f} s however many threads were set",
    ]


def ckpt_export() -> list[str]:
    e = load(COST)["export"]
    embedding = 128_256 * 2048 * 4 / 1e9  # llama3-1b: vocab x dim, fp32
    return [
        f"the 1.5B model took {e['export_s']:.1f} s",
        f"was {e['total_bytes'] / 1e9:.2f} GB in one shard" if e["shards"] == 1 else "?",
        f"with a peak RSS of {e['peak_rss'] / GIB:.2f} GiB",
        f"the shard being assembled ({e['total_bytes'] / 1e9:.1f} GB)",
        f"(the {embedding:.2f} GB embedding)",
    ]


def checkpoints_verify() -> list[str]:
    gb = load(COST)["bytes"] / 1e9
    return [
        f"AdamW states ({gb:.1f} GB): {verify(16, True)['s']:.1f} s from disk, "
        f"{verify(16, False)['s']:.1f} s from the page cache"
    ]


def checkpoints_export() -> list[str]:
    e = load(COST)["export"]
    return [
        f"({e['peak_rss'] / GIB:.1f} GiB for the 1.5B model in bf16, "
        f"one {e['total_bytes'] / 1e9:.1f} GB shard)"
    ]


def export_rows() -> dict[str, list]:
    rows = {}
    for rel, name in EXPORTS.items():
        for r in load(rel)["rows"]:
            limit = "none" if r["shard_limit"] >= 2**40 else f"{r['shard_limit'] / MIB:.0f} MiB"
            d, f = r["default"], r["fixed_mmap_threshold"]
            rows[f"{name} | {r['dtype']} | {limit}"] = [
                d["total_bytes"] / MIB,
                (d["peak"] - d["rss_before"]) / MIB,
                (f["peak"] - f["rss_before"]) / MIB,
            ]
    return rows


def export_baseline() -> list[str]:
    before = [
        r[k]["rss_before"] / MIB
        for rel in EXPORTS
        for r in load(rel)["rows"]
        for k in ("default", "fixed_mmap_threshold")
    ]
    return [f"post-import baseline ({min(before):.0f}-{max(before):.0f} MiB)"]


def export_shards() -> list[str]:
    rows = export_rows()
    s, w = rows["`small`, FSDP | fp32 | 20 MiB"], rows["`small` dim 1024, FSDP | fp32 | 20 MiB"]
    return [f"({w[0] / s[0]:.1f}x the model: +{w[1] - s[1]:.0f} MiB at 20 MiB shards)"]


RESUME_ROWS = {  # doc row -> run in resume.json
    "FSDP2 | FSDP2 (same layout)": "fsdp-to-fsdp",
    "ZeRO-3 (fused Adam) | ZeRO-3 (DeepSpeed's own loader)": "z3-to-z3",
    "FSDP2 | ZeRO-3": "fsdp-to-z3",
    "ZeRO-3 | FSDP2": "z3-to-fsdp",
    "ZeRO-1 (BF16 optimizer) | FSDP2": "z1-to-fsdp",
    "ZeRO-2 + CPU optimizer offload (CPU Adam) | DDP": "z2-offload-to-ddp",
}


def ckpt_resume() -> dict[str, list]:
    data = load(RESUME)
    return {
        row: [data[run]["rel"]["6"], max(data[run]["rel"].values())]
        for row, run in RESUME_ROWS.items()
    }


def ckpt_resume_text() -> list[str]:
    data = load(RESUME)
    f, z = data["fsdp-to-fsdp"]["reference"]["6"], data["z3-to-z3"]["reference"]["6"]
    return [f"already differ by {sci(abs(z - f) / f, 1)} at step 6 ({f:.5f} vs {z:.5f})"]


def preempt() -> dict[str, dict]:
    out = {}
    for r in load(PREEMPT):
        m = re.search(r"stopped at step (\d+) by \w+; saved \S+ in ([\d.]+) s", r["line"])
        out[r["case"]] = {**r, "stopped_step": int(m[1]), "save_s": float(m[2])}
    return out


def faults_preempt() -> dict[str, list]:
    def row(r: dict) -> list:
        lines = "one line" if r["stderr_lines"] == 1 else f"{r['stderr_lines']} lines"
        steps_lost = r["stopped_step"] - r["last_logged_step"]
        return [r["exit_status"], r["seconds_to_exit"], r["save_s"], steps_lost, lines]

    p = preempt()
    return {"FSDP2": row(p["fsdp"]), "ZeRO-3": row(p["zero3"])}


def faults_disk() -> list[str]:
    fsdp, gb = preempt()["fsdp"], load(COST)["bytes"] / 1e9
    return [
        f"about {gb / fsdp['save_s']:.2f} GB/s on this machine's disk",
        f"(the {gb:.2f} GB checkpoint of the same model",
    ]


def troubleshooting_preempt() -> list[str]:
    p, gb = preempt(), load(COST)["bytes"] / 1e9
    return [
        f"(an {gb:.0f} GB checkpoint) stopped in {p['fsdp']['seconds_to_exit']:.0f} s with FSDP2 "
        f"and {p['zero3']['seconds_to_exit']:.0f} s with ZeRO-3",
        f"(about {p['fsdp']['save_s'] / gb:.0f} s per GB on that disk",
    ]


def overhead_runs() -> list[tuple[dict, dict]]:
    runs = [bench(rel)["fsdp"] for rel in OVERHEADS]
    return [(runs[0], runs[1]), (runs[2], runs[3])]  # (before, after) per round


def faults_overhead() -> dict[str, list]:
    (b1, a1), (b2, a2) = overhead_runs()
    return {
        "llama3-1b seq 2048 mbs 8, FSDP2 + compile, fp32 master, round 1": [
            b1["tokens_per_s"],
            a1["tokens_per_s"],
            a1["tokens_per_s"] / b1["tokens_per_s"],
        ],
        "same, round 2": [
            b2["tokens_per_s"],
            a2["tokens_per_s"],
            a2["tokens_per_s"] / b2["tokens_per_s"],
        ],
    }


def faults_overhead_text() -> list[str]:
    pairs = overhead_runs()
    costs = [pct(1 - a["tokens_per_s"] / b["tokens_per_s"]) for b, a in pairs]
    step = statistics.median(a["step_time_s"] for _, a in pairs)
    return [f"cost {min(costs):.1f}-{max(costs):.1f}% of a {step:.2f} s step"]


def engines_kept_ratio() -> list[str]:
    r = bench(PAIR)
    ratio = r["zero3 mbs8 ga2"]["tokens_per_s"] / r["fsdp mbs8 ga2"]["tokens_per_s"]
    return [f"ZeRO-3 at {ratio:.3f}x FSDP2 on llama3-1b"]


@dataclass
class Check:
    doc: str  # relative to the repository root
    data: list[str]  # relative to docs/benchmarks/data/
    expected: Callable[[], Any]
    key: int = 1  # table rows: how many leading cells name the row


README, BENCH = "README.md", "docs/benchmarks/"
INDEX = "docs/benchmarks.md"  # the index of the write-ups, with their headline figures
PLANNING, CHECKPOINTS = "docs/planning.md", "docs/checkpoints.md"
TROUBLESHOOTING = "docs/troubleshooting.md"
SPEED_DOC, CKPT_DOC = BENCH + "2026-12-02-speed-h200.md", BENCH + "2026-12-02-checkpoints-h200.md"
FAULTS_DOC = BENCH + "2026-12-03-faults-h200.md"
PLANNER_DATA = [PLANNER, FIRST, BEFORE1, PAIR, ALL13]
HOUSE_DOC = BENCH + "2026-12-03-house-h200.md"
CHECKS: dict[str, Check] = {
    "house-speed": Check(
        HOUSE_DOC, [HOUSE + f"{n}/results.json" for n in ("8b", "1b", "13b")], house_speed
    ),
    "house-speed-ratio": Check(
        HOUSE_DOC, [HOUSE + f"{n}/results.json" for n in ("8b", "1b")], house_speed_ratio
    ),
    "readme-1b": Check(README, [PAIR], readme_1b),
    "planning-accuracy": Check(PLANNING, PLANNER_DATA, planning_accuracy),
    "checkpoints-verify": Check(CHECKPOINTS, [COST], checkpoints_verify),
    "checkpoints-export": Check(CHECKPOINTS, [COST], checkpoints_export),
    "troubleshooting-preempt": Check(TROUBLESHOOTING, [PREEMPT, COST], troubleshooting_preempt),
    "benchmarks-speed": Check(INDEX, [HOUSE8B, FIRST, PAIR, ALL13], index_speed),
    "speed-8b-first": Check(SPEED_DOC, [FIRST], speed_8b_first),
    "speed-8b-first-ratio": Check(SPEED_DOC, [FIRST], speed_8b_first_text),
    "speed-1b-pair": Check(SPEED_DOC, [PAIR], speed_1b),
    "speed-1b-pair-ratio": Check(SPEED_DOC, [PAIR], speed_1b_text),
    "speed-13b": Check(SPEED_DOC, [ALL13], speed_13b),
    "speed-levers": Check(SPEED_DOC, [FIRST, PAIR], speed_levers),
    "speed-planner": Check(SPEED_DOC, PLANNER_DATA, speed_planner),
    "speed-misses": Check(SPEED_DOC, [PAIR, FIRST], speed_misses),
    "ckpt-resume": Check(CKPT_DOC, [RESUME], ckpt_resume, key=2),
    "ckpt-resume-engines": Check(CKPT_DOC, [RESUME], ckpt_resume_text),
    "ckpt-size": Check(CKPT_DOC, [COST], ckpt_size),
    "ckpt-verify": Check(CKPT_DOC, [COST], ckpt_verify),
    "ckpt-rates": Check(CKPT_DOC, [COST, COST_FIRST], ckpt_rates),
    "ckpt-export": Check(CKPT_DOC, [COST], ckpt_export),
    "export-baseline": Check(CKPT_DOC, list(EXPORTS), export_baseline),
    "export-memory": Check(CKPT_DOC, list(EXPORTS), export_rows, key=3),
    "export-shards": Check(CKPT_DOC, list(EXPORTS)[:2], export_shards),
    "faults-preempt": Check(FAULTS_DOC, [PREEMPT], faults_preempt),
    "faults-preempt-disk": Check(FAULTS_DOC, [PREEMPT, COST], faults_disk),
    "faults-overhead": Check(FAULTS_DOC, OVERHEADS, faults_overhead),
    "faults-overhead-cost": Check(FAULTS_DOC, OVERHEADS, faults_overhead_text),
    "engines-kept-ratio": Check(
        BENCH + "2026-12-02-engines-llama3-1b-h200.md", [PAIR], engines_kept_ratio
    ),
}
CHECKS.update({name: Check(FT_DOC, data, fn) for name, (data, fn) in FINETUNE.items()})
CHECKS["readme-finetune-fast"] = Check(README, *README_FINETUNE_FAST)
CHECKS["benchmarks-finetune-fast"] = Check(INDEX, *README_FINETUNE_FAST)
CHECKS.update({name: Check(FAST_DOC, data, fn) for name, (data, fn) in FINETUNE_FAST.items()})
CHECKS.update({name: Check(S2_DOC, data, fn) for name, (data, fn) in SPEED2.items()})
CHECKS["readme-8b"] = Check(README, *README_8B)
CHECKS["benchmarks-speed2"] = Check(INDEX, *INDEX_SPEED2)
CHECKS["benchmarks-zero3-8b"] = Check(INDEX, *INDEX_ZERO3)
CHECKS["benchmarks-planner-heldout"] = Check(INDEX, *INDEX_HELDOUT)
CHECKS.update({name: Check(S2B_DOC, d, fn, key) for name, (d, fn, key) in SPEED2B.items()})
CHECKS["benchmarks-24gb"] = Check(INDEX, *INDEX_24GB)
CHECKS["benchmarks-planner-today"] = Check(INDEX, *INDEX_PLANNER_TODAY)
CHECKS.update({name: Check(FK_DOC, d, fn, key) for name, (d, fn, key) in FIRST_K.items()})
CHECKS["benchmarks-first-k"] = Check(INDEX, *INDEX_FIRST_K)
CHECKS.update({name: Check(QLORA_DOC, d, fn, key) for name, (d, fn, key) in QLORA.items()})
CHECKS.update({name: Check(QLORA4_DOC, d, fn, key) for name, (d, fn, key) in QLORA4.items()})
CHECKS.update({name: Check(QLORA5_DOC, d, fn, key) for name, (d, fn, key) in QLORA5.items()})
CHECKS.update(
    {name: Check(QLORA_REBUILD_DOC, d, fn, key) for name, (d, fn, key) in QLORA_REBUILD.items()}
)
CHECKS.update({name: Check(QLORA_KERNEL_DOC, d, fn) for name, (d, fn) in QLORA_KERNEL.items()})
CHECKS.update(
    {name: Check(QLORA_KERNEL_H100_DOC, d, f, k) for name, (d, f, k) in QLORA_KERNEL_H100.items()}
)
CHECKS.update(
    {name: Check(QLORA_RECOMPUTE_DOC, d, f, k) for name, (d, f, k) in QLORA_RECOMPUTE.items()}
)
CHECKS["readme-qlora"] = Check(README, *README_QLORA_RECOMPUTE)
CHECKS["readme-dpo"] = Check(README, *README_DPO)
CHECKS["readme-nvme"] = Check(README, *README_NVME)
CHECKS.update({name: Check(DPO_DOC, d, fn, key) for name, (d, fn, key) in DPO_CURVE.items()})
CHECKS.update({name: Check(DPO_H100_DOC, d, fn, key) for name, (d, fn, key) in DPO_H100.items()})
CHECKS.update({name: Check(NVME_DOC, d, fn, key) for name, (d, fn, key) in NVME.items()})
CHECKS.update(
    {name: Check(HELDOUT_H100_DOC, d, fn, key) for name, (d, fn, key) in HELDOUT_H100.items()}
)
CHECKS.update(
    {name: Check(HOST_PROBE_DOC, d, fn, key) for name, (d, fn, key) in HOST_PROBE_H100.items()}
)
CHECKS.update(
    {name: Check(HOST_PROBE_2_DOC, d, fn, key) for name, (d, fn, key) in HOST_PROBE_H100_2.items()}
)
CHECKS.update(
    {name: Check(HOST_PROBE_5_DOC, d, fn, key) for name, (d, fn, key) in HOST_PROBE_H100_5.items()}
)
CHECKS.update(
    {name: Check(HOST_PROBE_7_DOC, d, fn, key) for name, (d, fn, key) in HOST_PROBE_H100_7.items()}
)
CHECKS.update({name: Check(TIMER_8_DOC, d, fn, key) for name, (d, fn, key) in TIMER_H100_8.items()})
CHECKS.update({name: Check(DS_SPY_DOC, d, fn, key) for name, (d, fn, key) in DS_SPY_H100_9.items()})


# ---------------------------------------------------------------------------------------------
# The tests


def all_blocks() -> tuple[list[Block], list[Block]]:
    tagged, tables = [], []
    for doc in DOCS:
        t, tab = blocks(doc)
        tagged += t
        tables += tab
    return tagged, tables


def figure_errors(block: Block) -> list[str]:
    check = CHECKS[block.name]
    if block.kind == "table":
        return check_table(block, check.expected(), check.key)
    return check_text(block, check.expected())


def test_every_table_names_its_data() -> None:
    tagged, tables = all_blocks()
    claimed = {(b.doc, b.line) for b in tagged if b.kind == "table"}
    missing = [t.where() for t in tables if (t.doc, t.line) not in claimed]
    assert not missing, f"tables without a `<!-- data NAME: PATH -->` line above them: {missing}"


def test_every_data_comment_has_its_check_and_files() -> None:
    tagged, _ = all_blocks()
    seen: dict[str, str] = {}
    for b in tagged:
        assert b.name in CHECKS, f"{b.where()}: no check named {b.name!r} in {__file__}"
        assert b.name not in seen, f"{b.where()}: {b.name!r} is also used at {seen[b.name]}"
        seen[b.name] = b.where()
        check = CHECKS[b.name]
        assert b.doc == ROOT / check.doc, f"{b.where()}: {b.name!r} belongs to {check.doc}"
        for p in b.paths:
            assert p.is_file(), f"{b.where()}: data file {p} does not exist"
        want = {(DATA / rel).resolve() for rel in check.data}
        assert set(b.paths) == want, f"{b.where()}: names {b.paths}, its check reads {want}"
    unused = sorted(set(CHECKS) - set(seen))
    assert not unused, f"checks with no data comment in the docs: {unused}"


@pytest.mark.parametrize("name", sorted(CHECKS))
def test_figures_match_their_data(name: str) -> None:
    tagged, _ = all_blocks()
    found = [b for b in tagged if b.name == name]
    if not found:
        pytest.skip("not used (test_every_data_comment_has_its_check_and_files fails)")
    errors = figure_errors(found[0])
    assert not errors, f"{found[0].where()} ({name}):\n" + "\n".join(errors)


def figure_paragraphs(text: str, heading: str | None) -> list[str]:
    """The paragraphs (outside code fences) of `text`, or of its section under `heading`, that
    state a figure; tables are left to test_every_table_names_its_data."""
    if heading is not None:
        text = text[text.index(heading) :]
        text = text[: text.index("\n## ", 1)] if "\n## " in text[1:] else text
    fenced = _fenced(text.splitlines())
    text = "\n".join("" if f else line for line, f in zip(text.splitlines(), fenced, strict=True))
    return [
        para
        for para in re.split(r"\n\s*\n", text)
        if not any(_is_table(line) for line in para.splitlines())
        and any(is_figure(m) for m in NUMBER.finditer(COMMENT.sub(" ", para)))
    ]


@pytest.mark.parametrize(("doc", "heading"), FIGURE_PAGES)
def test_figure_paragraphs_name_their_data(doc: str, heading: str | None) -> None:
    text = (ROOT / doc).read_text()
    for para in figure_paragraphs(text, heading):
        assert COMMENT.search(para), f"{doc}: a paragraph with figures and no data: {para!r}"


def test_the_figure_paragraph_finder_finds_them() -> None:
    text = (
        "# T\n\nIntro.\n\n## Figures\n\nIt ran 1.5 s.\n\n<!-- data a: x.json -->\nIt ran 2.5 s."
        "\n\n<!-- data b:\n  y.json\n-->\nIt ran 3.5 s.\n\n```\n4.5 s\n```\n\n| t | 5.5 |\n\n"
        "## Next\n\nIt ran 6.5 s.\n"
    )
    found = figure_paragraphs(text, "## Figures")
    assert found == ["It ran 1.5 s.", "<!-- data a: x.json -->\nIt ran 2.5 s.", found[2]]
    assert [bool(COMMENT.search(p)) for p in found] == [False, True, True]


def _bump(text: str, m: re.Match) -> str:
    """`text` with the leading digit of the number `m` changed."""
    at = m.start("whole")
    return text[:at] + str((int(text[at]) + 1) % 10) + text[at + 1 :]


def altered(block: Block) -> Block | None:
    """The block with its last checked number changed, or None when it checks no number."""
    if block.kind == "table":
        lines = list(block.lines)
        key = CHECKS[block.name].key
        for i in range(len(lines) - 1, 1, -1):
            row = lines[i]
            cut = [n for n, ch in enumerate(row) if ch == "|"][key]  # after the key cells
            found = [m for m in NUMBER.finditer(row) if m.start() > cut]
            if found:
                lines[i] = _bump(row, found[-1])
                return Block(block.doc, block.line, block.kind, lines, block.name, block.paths)
        return None
    text = text_of(block)
    spans = [(text.find(s), text.find(s) + len(s)) for s in CHECKS[block.name].expected()]
    inside = [m for m in NUMBER.finditer(text) if any(a <= m.start() < b for a, b in spans)]
    if not inside:
        return None
    return Block(block.doc, block.line, "text", [_bump(text, inside[-1])], block.name, block.paths)


def test_the_checker_fails_on_a_changed_figure() -> None:
    """Change one checked number in each tagged table and paragraph: every one must then fail."""
    tagged, _ = all_blocks()
    assert len(tagged) == len(CHECKS)
    for b in tagged:
        assert not figure_errors(b), f"{b.where()} fails before any change"
        changed = altered(b)
        if changed is not None:
            assert figure_errors(changed), f"{b.where()}: a changed figure went unnoticed"


def test_rounding_rules() -> None:
    def one(text: str) -> re.Match:
        m = NUMBER.search(text)
        assert m is not None
        return m

    assert same(one("11,783"), 11782.9) and not same(one("11,783"), 11781.4)
    assert same(one("61.3%"), 61.26) and not same(one("61.3%"), 61.36)
    assert same(one("1.2e-5"), 1.15e-5 + 1e-9) and not same(one("1.2e-5"), 1.148e-5)
    assert same(one("−0.3%"), -0.29) and same(one("(+2.2%)"), 2.2)
    assert [m[0] for m in NUMBER.finditer("15.5-18.1 s, 1.50B, llama3-1b, 0.957x")] == [
        "15.5",
        "18.1",
        "0.957x",
    ]


def test_tables_and_tags_are_found(tmp_path: Path) -> None:
    doc = tmp_path / "doc.md"
    doc.write_text(
        "Intro 1.5 s.\n\n"
        "<!-- data t1: a.json -->\n| a | b |\n|---|---:|\n| x | 1.0 |\n\n"
        "| untagged | b |\n|---|---:|\n| y | 2.0 |\n\n"
        "<!-- no data: options -->\n| option | meaning |\n|---|---|\n| k | v |\n\n"
        "```\n| in a fence | b |\n```\n\n"
        "- item one 3.5 s <!-- data t2: b.json -->\n  continued\n- item two 4.5 s\n\n"
        "<!-- data t3: c.json -->\n- first 5.5 s\n- second 6.5 s\n\n"
        "<!-- data t4:\n  d.json\n  e.json\n-->\n| a | b |\n|---|---:|\n| z | 7.0 |\n\n"
        "<!-- data t5:\n  f.json -->\nA paragraph 8.5 s\nlong.\n"
    )
    tagged, tables = blocks(doc)
    assert [(b.name, b.kind, b.line, len(b.lines)) for b in tagged] == [
        ("t1", "table", 4, 3),
        ("t2", "text", 21, 2),
        ("t3", "text", 26, 2),
        ("t4", "table", 33, 3),
        ("t5", "text", 39, 2),
    ]
    assert [t.line for t in tables] == [4, 8, 33]  # tagged, untagged, multi-line tagged
    assert tagged[0].paths == [tmp_path / "a.json"]
    assert tagged[3].paths == [tmp_path / "d.json", tmp_path / "e.json"]
    assert tagged[4].paths == [tmp_path / "f.json"]
    doc.write_text("<!-- data t6:\n  g.json\n| a | b |\n")
    with pytest.raises(AssertionError, match="without its -->"):
        blocks(doc)
