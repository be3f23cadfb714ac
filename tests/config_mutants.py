"""Hostile variants of configs/tiny-cpu.yaml for the config fuzz test (test_config_fuzz.py).

`mutants(seed, n)` returns n reproducible `Mutant`s (config file bytes plus extra CLI flags),
taking the classes in `MUTATORS` in turn so that every run covers each of them. The base config
reads `corpus.txt` (the test writes it) instead of the stdlib sources, so that an accepted
mutant prepares its data in milliseconds.
"""

from __future__ import annotations

import copy
import random
import re
from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path

import yaml

from zerofit.launch.run_config import field_help
from zerofit.models.llama import LlamaArgs

BASE_FILE = Path(__file__).resolve().parents[1] / "configs" / "tiny-cpu.yaml"
CORPUS = "corpus.txt"

# Values of every kind, for any field: wrong types, edge and absurd numbers, odd strings.
VALUES: list[object] = [
    None, True, False, 0, -1, 1, 2, 3, 1.5, -0.0, 0.5, 1e30, -1e30, float("inf"), float("nan"),
    2**31, 2**63, 2**64, -(2**63), 10**30, "", " ", "x", "1e30", "5e7", "3e-4", "abc", "é",
    "日本語", "\U0001f600", "a\x00b", "a\nb", "tab\there", "\u202eevil", "\x1b[31mred", "x" * 10_001,
    "y" * 300, [], [1, 2], [[]], {}, {"a": 1}, {"steps": 5}, "auto", "stdlib", "byte", "fsdp",
    "ddp", "deepspeed", "none", "cpu", "nvme", "bf16", "fp16", "fp32", "tiny", "small", "70b",
    "runs/fuzz", ".", CORPUS,
]  # fmt: skip
PATHS = [
    CORPUS, f"{CORPUS}/sub", "/proc/zerofit-fuzz", "/dev/null", "a\x00b", "x" * 100_000,
    "d/" + "y" * 300, "runs/fuzz-ok", "", "~no-such-user-zf/x", "ünï/cødé", "a\nb", "a/" * 2000,
]  # fmt: skip
PATH_FIELDS = [
    "log.run_dir", "checkpoint.dir", "data.source", "data.tokenizer", "model.hf",
    "parallel.deepspeed.config", "parallel.deepspeed.nvme_path",
]  # fmt: skip
# Raw YAML put where a value was: what only text can express (tags, anchors, odd scalars).
SNIPPETS = [
    "1e30", "1.0e+30", "-1", "1.5", ".inf", "-.inf", ".nan", "0x7fffffffffffffff", "0o17",
    "1_000", "9" * 120, "9" * 5000, "-0", "1e-400", "yes", "on", "~", "=", "!", "''", '"\\0"',
    '"\\x1b[31m"', '"\\u202e"', '"\\ud800"', "{a: 1}", "[1, 2]", "&a 1", "*a", "!!str 5",
    "!!python/object/apply:os.system ['echo hi']", "!!binary aGk=", "!!timestamp 2001-99-99",
    "!!int abc", "!!float x", "!!set {a}", "!!omap [a: 1]", "!custom x", "2001-12-14",
    "[" * 40 + "]" * 40, "{a: {b: {c: {d: 1}}}}", "? a", "|\n  text", "'unterminated",
]  # fmt: skip
NON_STRING_KEYS = [
    "1: x", "? [a, b]\n: c", "null: 1", "true: {}", "<<: {train: {steps: 1}}", "1.5: a",
    "? {a: 1}\n: b", "~: x", "train: {1: 2}", "model: {overrides: {1: 2}}",
]  # fmt: skip
WHOLE_FILES = [
    "", "# only a comment\n", "- a\n- b\n", "42\n", "just text\n", "---\n...\n", "{}\n", "[]\n",
    "~\n", "train:\n\tsteps: 5\n", "train:\n  steps: 5\n    micro: 1\n", "%YAML 1.1\n---\n{}\n",
    "%TAG ! tag:evil.com,2000:\n--- !x {}\n", "? - a\n", "train: {steps: 5}}\n", ": x\n",
]  # fmt: skip
BAD_BYTES = [b"\xff", b"\xfe", b"\xc3", b"\xc0\xaf", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\x80"]
CONTROL = ["\x00", "\x01", "\x1b", "\x7f", "\x85", "\u2028", "\ufeff", "\t", "\r", "\x0b"]
ENCODINGS = ["utf-16", "utf-16-le", "utf-16-be", "utf-32", "utf-32-le", "latin-1", "cp1252"]


@dataclass
class Mutant:
    kind: str
    data: bytes
    args: tuple[str, ...] = ()


class Ctx:
    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.text = base_text()
        self.tree = yaml.safe_load(self.text)

    def dump(self, tree: object) -> bytes:
        flow = self.rng.choice([None, True, False])
        text = yaml.safe_dump(tree, default_flow_style=flow, allow_unicode=self.rng.random() < 0.5)
        return text.encode()

    def value(self) -> object:
        return copy.deepcopy(self.rng.choice(VALUES))

    def with_value(self, dotted: str, value: object) -> bytes:
        tree = copy.deepcopy(self.tree)
        node = tree
        *parents, leaf = dotted.split(".")
        for part in parents:
            if not isinstance(node.get(part), dict):
                node[part] = {}
            node = node[part]
        node[leaf] = value
        return self.dump(tree)

    def replace_value(self, raw: str) -> bytes:
        """The base file with one value of its flow mappings (`{key: value, ...}`) replaced."""
        text = self.text
        pairs = [
            m
            for m in re.finditer(r"[{,]\s*(\w+): ([^,{}\n]+)", text)
            if not text[text.rfind("\n", 0, m.start()) + 1 :].startswith("#")
        ]
        m = self.rng.choice(pairs)
        return (text[: m.start(2)] + raw + text[m.end(2) :]).encode()

    def at_random(self, data: bytes, insert: bytes) -> bytes:
        i = self.rng.randrange(len(data) + 1)
        return data[:i] + insert + data[i:]


def base_text() -> str:
    text = BASE_FILE.read_text()
    assert "source: stdlib" in text, "configs/tiny-cpu.yaml changed: update the fuzz base"
    return text.replace("source: stdlib", f"source: {CORPUS}")


def leaf_fields() -> list[str]:
    llama = [f"model.overrides.{f.name}" for f in fields(LlamaArgs)]
    return [key for key, _, _ in field_help()] + llama


# ----------------------------------------------------------------------------- mutators


def set_field(c: Ctx) -> Mutant:
    return Mutant("set_field", c.with_value(c.rng.choice(leaf_fields()), c.value()))


def model_override(c: Ctx) -> Mutant:
    name = c.rng.choice([f.name for f in fields(LlamaArgs)] + ["bogus"])
    value = c.rng.choice([1.5, -1, 0, 10**9, 2**70, "x", True, None, 3, 64, float("nan")])
    return Mutant("model_override", c.with_value(f"model.overrides.{name}", value))


def path_value(c: Ctx) -> Mutant:
    value: object = c.rng.choice(PATHS)
    dotted = c.rng.choice(PATH_FIELDS)
    if dotted == "data.source" and c.rng.random() < 0.3:
        value = [CORPUS, value]
    return Mutant("path_value", c.with_value(dotted, value))


def delete_key(c: Ctx) -> Mutant:
    tree = copy.deepcopy(c.tree)
    section = c.rng.choice(list(tree))
    if c.rng.random() < 0.3 or not tree[section]:
        del tree[section]
    else:
        del tree[section][c.rng.choice(list(tree[section]))]
    return Mutant("delete_key", c.dump(tree))


def rename_key(c: Ctx) -> Mutant:
    tree = copy.deepcopy(c.tree)
    new = c.rng.choice(["trian", "Train", "", " ", "x" * 10_000, "kéy", "a.b", "steps ", "\u202e"])
    section = c.rng.choice(list(tree))
    if c.rng.random() < 0.4:
        tree[new] = tree.pop(section)
    else:
        key = c.rng.choice(list(tree[section]))
        tree[section][new] = tree[section].pop(key)
    return Mutant("rename_key", c.dump(tree))


def wrong_section(c: Ctx) -> Mutant:
    tree = copy.deepcopy(c.tree)
    name = c.rng.choice([*tree, "precision", "checkpoint", "parallel.deepspeed"])
    value = c.rng.choice([[1, 2], 5, "x", [], True, 1.5, [{"steps": 5}]])
    if name == "parallel.deepspeed":
        tree["parallel"]["deepspeed"] = value
    else:
        tree[name] = value
    args: tuple[str, ...] = ()
    if c.rng.random() < 0.5:  # flags under the broken section must not paper over it
        key = next(k for k, _, _ in field_help() if k.startswith(name + "."))
        args = (f"--{key}", "5")
    return Mutant("wrong_section", c.dump(tree), args)


def unknown_key(c: Ctx) -> Mutant:
    tree = copy.deepcopy(c.tree)
    target = tree if c.rng.random() < 0.3 else tree[c.rng.choice(list(tree))]
    target[c.rng.choice(["bogus", "stepz", "lr ", "x" * 500])] = c.value()
    return Mutant("unknown_key", c.dump(tree))


def cli_override(c: Ctx) -> Mutant:
    key = c.rng.choice(leaf_fields())
    raw = c.rng.choice([*SNIPPETS, "", "5", "x" * 20_000, "a\nb", "[1", "9" * 5000])
    odd = [("--train.steps",), ("--.x=1",), ("--train..steps=1",), ("steps",), ("--a.b=1",)]
    extra = c.rng.choice(odd) if c.rng.random() < 0.3 else ()
    return Mutant("cli_override", c.text.encode(), (f"--{key}", raw, *extra))


def raw_value(c: Ctx) -> Mutant:
    return Mutant("raw_value", c.replace_value(c.rng.choice(SNIPPETS)))


def deep_nesting(c: Ctx) -> Mutant:
    n = c.rng.choice([33, 40, 100, 999, 1001, 5000, 20_000])
    shape = c.rng.choice(["list", "map", "block"])
    if shape == "list":
        raw = "[" * n + "]" * n
    elif shape == "map":
        raw = "{a: " * n + "1" + "}" * n
    else:
        n = min(n, 700)  # indentation grows quadratically: stay under the size limit
        return Mutant("deep_nesting", "".join(" " * i + "a:\n" for i in range(n)).encode())
    return Mutant("deep_nesting", c.replace_value(raw))


def alias_bomb(c: Ctx) -> Mutant:
    levels, width = c.rng.randint(2, 9), c.rng.randint(2, 10)
    defs = ["a0: &a0 [lol]"]
    for i in range(1, levels + 1):
        defs.append(f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * width)}]")
    if c.rng.random() < 0.5:  # where a loader that expands aliases would walk it
        body = "".join(f"    {d}\n" for d in defs)
        model = f"model:\n  preset: tiny\n  overrides:\n{body}    n_layers: *a{levels}\n"
        text = re.sub(r"(?m)^model: .*\n", lambda _: model, c.text)
    else:
        text = "\n".join(defs) + "\n" + c.text
    return Mutant("alias_bomb", text.encode())


def duplicate_key(c: Ctx) -> Mutant:
    lines = c.text.splitlines()
    i = c.rng.choice([j for j, line in enumerate(lines) if ": {" in line])
    if c.rng.random() < 0.5:
        lines.insert(i + 1, lines[i])  # a whole section twice
    else:
        key = re.search(r"\{(\w+): ", lines[i])
        lines[i] = lines[i].replace("{", "{" + key.group(1) + ": 1, ", 1) if key else lines[i]
    return Mutant("duplicate_key", ("\n".join(lines) + "\n").encode())


def non_string_key(c: Ctx) -> Mutant:
    return Mutant("non_string_key", (c.text + c.rng.choice(NON_STRING_KEYS) + "\n").encode())


def huge_value(c: Ctx) -> Mutant:
    n = c.rng.choice([10_001, 100_000, 2_000_000])
    raw = c.rng.choice(["x" * n, '"' + "é" * n + '"', "9" * n])
    if c.rng.random() < 0.3:
        return Mutant("huge_value", (c.text + raw[:n] + ": 1\n").encode())  # a huge key
    return Mutant("huge_value", c.replace_value(raw))


def whole_file(c: Ctx) -> Mutant:
    choice = c.rng.choice([*WHOLE_FILES, "TWO_DOCS"])
    text = c.text + "---\n" + c.text if choice == "TWO_DOCS" else choice
    return Mutant("whole_file", text.encode())


def encoding(c: Ctx) -> Mutant:
    text = c.text.replace("# The", "# Thé 日本")
    name = c.rng.choice([*ENCODINGS, "utf-8-sig"])
    return Mutant("encoding", text.encode(name, errors="replace"))


def bad_bytes(c: Ctx) -> Mutant:
    data = c.text.encode()
    for _ in range(c.rng.randint(1, 3)):
        data = c.at_random(data, c.rng.choice(BAD_BYTES))
    return Mutant("bad_bytes", data)


def control_chars(c: Ctx) -> Mutant:
    ch = c.rng.choice(CONTROL)
    if c.rng.random() < 0.5:
        return Mutant("control_chars", c.at_random(c.text.encode(), ch.encode()))
    escaped = ch.encode("unicode_escape").decode()  # a YAML double-quoted escape, too
    return Mutant("control_chars", c.replace_value(f'"a{escaped}b"'))


def truncate(c: Ctx) -> Mutant:
    data = c.text.encode()
    return Mutant("truncate", data[: c.rng.randrange(len(data))])


def byte_flip(c: Ctx) -> Mutant:
    data = bytearray(c.text.encode())
    for _ in range(c.rng.randint(1, 4)):
        i = c.rng.randrange(len(data))
        data[i] ^= c.rng.randrange(1, 256)
    return Mutant("byte_flip", bytes(data))


def numbers(c: Ctx) -> Mutant:
    value = c.rng.choice([1e30, -5, 0, 1.5, 2**64, -(2**70), 10**40, 0.0, 1e-300, 2**53 + 1])
    ints = [k for k, d, _ in field_help() if d.lstrip("-").isdigit()]
    return Mutant("numbers", c.with_value(c.rng.choice(ints), value))


MUTATORS: list[Callable[[Ctx], Mutant]] = [
    set_field, model_override, path_value, delete_key, rename_key, wrong_section, unknown_key,
    cli_override, raw_value, deep_nesting, alias_bomb, duplicate_key, non_string_key, huge_value,
    whole_file, encoding, bad_bytes, control_chars, truncate, byte_flip, numbers,
]  # fmt: skip


def mutants(seed: int, n: int) -> list[Mutant]:
    """n mutants from `seed`: the same list for the same seed, every class in turn."""
    c = Ctx(random.Random(seed))
    return [MUTATORS[i % len(MUTATORS)](c) for i in range(n)]
