"""Hostile configs, case by case: each refused with one short line (exit 2) and in time.

The regression mutants in tests/data/config_mutants/ go through `zerofit train` as the fuzz test
runs them; the other cases pin each limit of `zerofit.config.yaml_safe`, `zerofit.config.limits` and the
schema checks at its edge.
"""

from __future__ import annotations

import dataclasses
import math
import time
import tracemalloc
import typing
from pathlib import Path

import pytest
from test_config_fuzz import Mutant, fuzz_workdir, problem, run_mutant

from zerofit.backends.catalog import RunConfig as Config
from zerofit.config import read_yaml
from zerofit.config.limits import MAX_STRING, shown
from zerofit.config.yaml_safe import MAX_BYTES, MAX_DEPTH, MAX_NODES, load_yaml_text
from zerofit.errors import UserError
from zerofit.launch.run_config import config_from_dict, int_bounds, load_config
from zerofit.models import build_model
from zerofit.models.hf import _check_override

MUTANTS = Path(__file__).parent / "data" / "config_mutants"
EXPECTED = {  # file -> a part of its one error line
    "alias_bomb.yaml": "anchors and aliases (&name, *name) are not supported",
    "deep_nesting.yaml": "nest",  # libyaml's limit (1000) or ours, whichever comes first
    "deep_mapping.yaml": f"nested deeper than {MAX_DEPTH} levels",
    "utf16.yaml": "not UTF-8 text (UTF-16 byte-order mark)",
    "latin1.yaml": "not UTF-8 text (byte 0xe9",
    "duplicate_key.yaml": "duplicate key 'steps' (first at line 6)",
    "float_int_override.yaml": "n_layers must be an integer, got 1.5",
    "seed_1e30.yaml": "train.seed must be <= 4294967295, got 1000000000000000019884624838656",
    "negative_max_tokens.yaml": "data.max_tokens must be >= 1, got -5",
    "eval_batches_zero.yaml": "train.eval_batches must be >= 1, got 0",
    "python_tag.yaml": "YAML tag 'tag:yaml.org,2002:python/object/apply:os.system' is not supported",
    "non_string_key.yaml": "a key that is not text",
    "train_list.yaml": "train: expected a mapping, got [1, 2]",
    "huge_value.yaml": "a value of 10001 characters (at most 10000)",
    "tilde_user.yaml": "data.source: no home directory for '~no-such-user-zf/data.txt'",
}


def refused(text: str, overrides: list[str] | None = None, tmp: Path | None = None) -> str:
    """The UserError message a config text gets from load_config."""
    path = (tmp or Path(".")) / "c.yaml"
    path.write_text(text)
    with pytest.raises(UserError) as e:
        load_config(path, overrides)
    return str(e.value)


def test_every_regression_mutant_has_an_expectation() -> None:
    assert sorted(p.name for p in MUTANTS.iterdir()) == sorted(EXPECTED)


HANG_S = 30.0  # what "no hang" means in these tests; speed itself is not tested here


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_regression_mutants(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    work = fuzz_workdir(tmp_path, monkeypatch)
    run_mutant(Mutant("warm-up", b"{}"), work / "warm.yaml")  # first-call imports, untimed
    o = run_mutant(Mutant(name, (MUTANTS / name).read_bytes()), work / name)
    assert o.code == 2 and problem(o) is None, problem(o) or o.err
    assert EXPECTED[name] in o.err, o.err


def test_alias_bomb_costs_no_time_or_memory(tmp_path: Path) -> None:
    tracemalloc.start()
    start = time.perf_counter()
    with pytest.raises(UserError, match="anchors and aliases"):
        read_yaml(MUTANTS / "alias_bomb.yaml")
    elapsed = time.perf_counter() - start
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    # Memory is the proof (an expanded bomb holds gigabytes); the time bound only catches a hang,
    # with room for a loaded machine.
    assert peak < 5 * 2**20 and elapsed < HANG_S, (elapsed, peak)


@pytest.mark.parametrize("shape", ["list", "map", "block"])
def test_nesting_limit(shape: str) -> None:
    def nested(n: int) -> str:  # n collections inside the top-level mapping
        if shape == "block":
            return "".join(" " * i + "a:\n" for i in range(n)) + " " * n + "b: 1\n"
        if shape == "list":
            return "x: " + "[" * n + "1" + "]" * n
        return "x: " + "{a: " * n + "1" + "}" * n

    load_yaml_text(nested(MAX_DEPTH - 1))  # the top-level mapping is one level
    with pytest.raises(UserError, match=f"nested deeper than {MAX_DEPTH} levels"):
        load_yaml_text(nested(MAX_DEPTH))
    for n in (5000, 100_000):  # never a RecursionError, whoever's limit is hit first
        with pytest.raises(UserError, match="nest"):
            load_yaml_text(nested(min(n, 700) if shape == "block" else n))


def test_node_and_size_limits(tmp_path: Path) -> None:
    load_yaml_text("x: [" + ", ".join(["1"] * (MAX_NODES - 3)) + "]")
    with pytest.raises(UserError, match=f"more than {MAX_NODES} values"):
        load_yaml_text("x: [" + ", ".join(["1"] * MAX_NODES) + "]")
    big = tmp_path / "big.yaml"
    big.write_bytes(b"# " + b"x" * MAX_BYTES + b"\n")
    with pytest.raises(UserError, match=f"larger than {MAX_BYTES // 1024} KiB"):
        read_yaml(big)


@pytest.mark.parametrize(
    ("data", "needle"),
    [
        ("train: {steps: 5}\n".encode("utf-16-le"), "NUL bytes"),
        ("train: {steps: 5}\n".encode("utf-32"), "UTF-32 byte-order mark"),
        ("train: {steps: 5}\n".encode("utf-16-be"), "NUL bytes"),
        (b"train: {steps: 5}\n\xc0\xaf", "byte 0xc0 at offset 18"),
        (b"log: {run_dir: \xed\xa0\x80}\n", "byte 0xed"),  # an encoded surrogate
    ],
)
def test_encodings_other_than_utf8(tmp_path: Path, data: bytes, needle: str) -> None:
    (tmp_path / "c.yaml").write_bytes(data)
    with pytest.raises(UserError, match="not UTF-8 text") as e:
        load_config(tmp_path / "c.yaml")
    assert needle in str(e.value)


def test_utf8_with_bom_and_non_ascii_text_is_fine(tmp_path: Path) -> None:
    (tmp_path / "c.yaml").write_bytes(b"\xef\xbb\xbflog: {run_dir: r\xc3\xa9sum\xc3\xa9}\n")
    assert load_config(tmp_path / "c.yaml").log.run_dir == "résumé"


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("train: {steps: 1}\ntrain: {steps: 2}\n", "duplicate key 'train' (first at line 1)"),
        ("train:\n  steps: 1\n  seed: 0\n  steps: 2\n", "line 4, column 3: duplicate key 'steps'"),
        ("1: x\n", "a key that is not text"),
        ("? [a, b]\n: c\n", "a key that is not text"),
        ("null: 1\n", "a key that is not text"),
        ("train: {true: 1}\n", "a key that is not text"),
        ("train: {<<: {steps: 3}}\n", "a merge key (<<)"),
        ("train: !custom {steps: 3}\n", "the YAML tag '!custom' is not supported"),
        ("train: {steps: !!binary aGk=}\n", "tag:yaml.org,2002:binary"),
        ("train: {}\n---\nlog: {}\n", "expected a single document"),
        ("train: {seed: " + "9" * 101 + "}\n", "a value of 101 characters (at most 100)"),
        ("train: {steps: !!int abc}\n", "ValueError"),
        ("log: {run_dir: a\x01b}\n", "control characters are not allowed"),
        ("log: {every: 1}}\n", "bad YAML in"),
    ],
)
def test_yaml_constructs_refused(tmp_path: Path, text: str, needle: str) -> None:
    msg = refused(text, tmp=tmp_path)
    assert msg.startswith("bad YAML in ") and needle in msg and "\n" not in msg, msg


def test_odd_scalars_stay_strings() -> None:
    assert load_yaml_text("a: 2024-01-01\nb: =\nc: '!'") == {"a": "2024-01-01", "b": "=", "c": "!"}


@pytest.mark.parametrize(
    ("text", "flags", "needle"),
    [
        ("train: [1, 2]\n", [], "train: expected a mapping, got [1, 2]"),
        (
            "train: [1, 2]\n",
            ["train.steps=5"],
            "train: expected a mapping, got [1, 2] (so --train.*",
        ),
        ("train: 5\n", ["train.steps=5"], "train: expected a mapping, got 5"),
        ('model: "x"\n', [], "model: expected a mapping, got 'x'"),
        (
            "parallel: {deepspeed: [1]}\n",
            ["parallel.deepspeed.stage=2"],
            "parallel.deepspeed: expected a",
        ),
        ("train: {steps: 5}\n", ["train.steps.x=1"], "train.steps: expected a mapping, got 5"),
    ],
)
def test_sections_of_the_wrong_kind(tmp_path: Path, text: str, flags: list, needle: str) -> None:
    assert needle in refused(text, flags, tmp_path)


def test_flags_fill_an_empty_section(tmp_path: Path) -> None:
    (tmp_path / "c.yaml").write_text("train:\n")
    assert load_config(tmp_path / "c.yaml", ["train.steps=5"]).train.steps == 5


def _fields(cls: type, prefix: str = "") -> dict[str, typing.Any]:
    out = {}
    for f in dataclasses.fields(cls):
        tp = typing.get_type_hints(cls)[f.name]
        if dataclasses.is_dataclass(tp):
            out |= _fields(tp, f"{prefix}{f.name}.")
        else:
            out[f"{prefix}{f.name}"] = tp
    return out


def test_every_integer_field_is_bounded() -> None:
    """Each int field of the schema states both bounds (a new field without them fails here)."""
    ints = {k for k, tp in _fields(Config).items() if tp in (int, int | None)}
    assert ints == set(INT_RANGES) and len(ints) >= 25
    assert all(low is not None and high is not None for low, high in INT_RANGES.values())


INT_RANGES = int_bounds()


# Fields valid only next to another one (config.validate checks the pair); the range test sets both.
COMPANIONS: dict[str, dict[str, typing.Any]] = {
    "parallel.ac_blocks": {"parallel.activation_checkpointing": "first_k"},
}


def _with(dotted: str, value: typing.Any) -> dict:
    tree: dict = {}
    for name, leaf_value in {dotted: value, **COMPANIONS.get(dotted, {})}.items():
        *parents, leaf = name.split(".")
        node = tree
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = leaf_value
    return tree


@pytest.mark.parametrize("name", sorted(INT_RANGES))
def test_int_ranges_are_enforced(name: str) -> None:
    low, high = INT_RANGES[name]
    for ok in (low, high):
        assert config_from_dict(_with(name, ok))
    with pytest.raises(UserError, match=f"^{name} must be >= {low}, got {low - 1}$"):
        config_from_dict(_with(name, low - 1))
    with pytest.raises(UserError, match=f"^{name} must be <= {high}, got"):
        config_from_dict(_with(name, high + 1))
    with pytest.raises(UserError, match=f"^{name}: expected an integer, got 1.5$"):
        config_from_dict(_with(name, 1.5))
    with pytest.raises(UserError, match=f"^{name}: expected an integer, got True$"):
        config_from_dict(_with(name, True))


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_every_float_field_refuses_non_finite_values(bad: float) -> None:
    floats = [k for k, tp in _fields(Config).items() if "float" in str(tp)]
    assert len(floats) >= 9
    for name in floats:
        value = [bad, 0.9] if name == "optim.betas" else bad
        with pytest.raises(UserError, match=name):
            config_from_dict(_with(name, value))


@pytest.mark.parametrize(
    ("name", "value", "needle"),
    [
        ("parallel.deepspeed.offload_ratio", 1.5, "must be in [0, 1]"),
        ("parallel.deepspeed.min_loss_scale", 0, "must be a finite number > 0"),
        ("parallel.deepspeed.initial_scale_power", 65, "must be <= 64"),
        ("train.seed", "1e30", "must be <= 4294967295"),
        ("train.seed", 2**64, "must be <= 4294967295, got 18446744073709551616"),
        ("data.seed", 10**400, "got <a 401-digit number>"),
    ],
)
def test_numbers_out_of_range(name: str, value: typing.Any, needle: str) -> None:
    with pytest.raises(UserError) as e:
        config_from_dict(_with(name, value))
    assert needle in str(e.value)


@pytest.mark.parametrize(
    ("value", "needle"),
    [
        ("x" * (MAX_STRING + 1), f"too long ({MAX_STRING + 1} characters; at most {MAX_STRING})"),
        ("a\nb", "contains the non-printable character '\\n' at position 1"),
        ("\u202eevil", "non-printable character '\\u202e'"),
        ("\x1b[31mred", "non-printable character '\\x1b'"),
        ("a\x00b", "contains a NUL byte"),
    ],
)
def test_strings_too_long_or_not_printable(value: str, needle: str) -> None:
    for name in ("log.run_dir", "data.tokenizer", "data.field"):
        with pytest.raises(UserError) as e:
            config_from_dict(_with(name, value))
        msg = str(e.value)
        assert msg.startswith(name) and needle in msg and len(msg) < 400, msg


def test_printable_unicode_is_fine() -> None:
    assert config_from_dict(_with("log.run_dir", "ünï/日本/😀")).log.run_dir == "ünï/日本/😀"


@pytest.mark.parametrize(
    "flags",
    [
        ["train." + "k" * 100_000 + "=1"],
        ["parallel.backend=" + "b" * 9000],
        ["precision.mode=" + "m" * 9000],
        ["model.preset=" + "p" * 9000],
        ["train.steps=" + "9" * 5000],
        ["train.steps=[" + "1, " * 3000 + "1]"],
        ["data.source=[" + ", ".join(["a" * 5000] * 2) + "]"],
    ],
)
def test_messages_quote_values_short(flags: list[str]) -> None:
    with pytest.raises(UserError) as e:
        cfg = load_config(None, flags)
        build_model(cfg.model.preset, None, cfg.model.overrides)
    assert "..." in str(e.value) and len(str(e.value)) < 400, str(e.value)[:1000]


def test_shown() -> None:
    assert shown("abc") == "'abc'" and shown(5) == "5"
    assert len(shown("x" * 10**6)) <= 204 and "..." in shown("x" * 10**6)
    assert shown(10**5000) == "<a 5001-digit number>"
    assert len(shown([[["x" * 1000] * 1000] * 1000])) <= 204
    assert shown("a\nb\u2028c\x1bd", quote=False) == "a b c?d"


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        ({"n_layers": 1.5}, "n_layers must be an integer, got 1.5"),
        ({"n_layers": True}, "n_layers must be an integer, got True"),
        ({"dim": "x"}, "dim must be an integer, got 'x'"),
        ({"n_layers": -1}, "n_layers must be positive, got -1"),
        ({"n_layers": 10**9}, "n_layers must be at most 1024"),
        ({"vocab_size": 2**70}, "vocab_size must be at most 16777216"),
        ({"norm_eps": math.nan}, "norm_eps must be a finite number > 0, got nan"),
        ({"rope_theta": [1]}, "rope_theta must be a finite number > 0, got [1]"),
        ({"k" * 10_000: 1}, "unknown model override 'kkk"),
    ],
)
def test_model_overrides(overrides: dict, needle: str) -> None:
    start = time.perf_counter()
    with pytest.raises(UserError) as e:
        build_model("tiny", overrides=overrides)
    assert needle in str(e.value) and len(str(e.value)) < 400
    assert time.perf_counter() - start < HANG_S  # refused before building: no 10**9 layers


@pytest.mark.parametrize(
    ("key", "value", "old", "needle"),
    [
        ("hidden_size", 1.5, 64, "must be an integer in [1, 1048576], got 1.5"),
        ("num_hidden_layers", 10**6, 2, "must be an integer in [1, 1024]"),
        ("vocab_size", True, 100, "got True"),
        ("rms_norm_eps", "x", 1e-6, "expected a finite number, got 'x'"),
        ("rms_norm_eps", math.inf, 1e-6, "expected a finite number, got inf"),
        ("tie_word_embeddings", 1, False, "expected true or false"),
        ("bos_token_id", 1.5, 1, "expected an integer, got 1.5"),
        ("hidden_act", 5, "silu", "expected a str, got 5"),
    ],
)
def test_hf_override_kinds(key: str, value: typing.Any, old: typing.Any, needle: str) -> None:
    with pytest.raises(UserError) as e:
        _check_override(key, value, old)
    assert f"model.overrides.{key}" in str(e.value) and needle in str(e.value)


def test_hf_overrides_of_the_right_kind_pass() -> None:
    for key, value, old in [("hidden_size", 128, 64), ("rope_scaling", {"type": "linear"}, None)]:
        _check_override(key, value, old)


@pytest.fixture
def pure_python_yaml(monkeypatch: pytest.MonkeyPatch):  # noqa: ANN201
    """zerofit.config.yaml_safe as it is where PyYAML has no libyaml (then restored)."""
    import importlib
    import sys

    import zerofit.config.yaml_safe

    monkeypatch.setitem(sys.modules, "yaml.cyaml", None)
    yield importlib.reload(zerofit.config.yaml_safe)
    monkeypatch.undo()
    importlib.reload(zerofit.config.yaml_safe)


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("a: &x 1\nb: *x\n", "anchors and aliases"),
        ("x: " + "[" * 5000 + "]" * 5000, f"nested deeper than {MAX_DEPTH} levels"),
        ("a: 1\na: 2\n", "duplicate key 'a'"),
        ("a: b\x01\n", "special characters are not allowed"),
        ("x: [" + ", ".join(["1"] * MAX_NODES) + "]", f"more than {MAX_NODES} values"),
    ],
)
def test_limits_hold_without_libyaml(pure_python_yaml, text: str, needle: str) -> None:  # noqa: ANN001
    """The pure-Python parser keeps the same limits (no wall-clock bound here: the limits are
    counted, and a timed assertion fails on a loaded machine)."""
    assert "CParser" not in str(pure_python_yaml._Parser.__mro__)
    with pytest.raises(UserError, match="bad YAML in") as e:
        pure_python_yaml.load_yaml_text(text)
    assert needle in str(e.value)


@pytest.mark.parametrize("field", ["log.run_dir", "checkpoint.dir", "data.source"])
def test_paths_of_thousands_of_levels(tmp_path: Path, monkeypatch, field: str) -> None:  # noqa: ANN001
    """Path.mkdir(parents=True) recursed once per level: a RecursionError before this check."""
    work = fuzz_workdir(tmp_path, monkeypatch)
    o = run_mutant(Mutant("levels", b"{}", (f"--{field}", "a/" * 2000 + "x")), work / "c.yaml")
    assert o.code == 2 and problem(o) is None, problem(o)
    assert f"{field}: the path has 2001 levels (at most 256)" in o.err


@pytest.mark.parametrize(
    "flags",
    [
        ["--data.source", "abcdefghi/" * 40],
        ["--data.tokenizer", "abcdefghi/" * 40],
        ["--model.preset", "null", "--model.hf", "abcdefghi/" * 40],
        ["--parallel.backend", "deepspeed", "--parallel.deepspeed.config", "abcdefghi/" * 40],
    ],
)
def test_missing_long_paths_are_quoted_short(tmp_path: Path, monkeypatch, flags: list) -> None:  # noqa: ANN001
    work = fuzz_workdir(tmp_path, monkeypatch)
    o = run_mutant(Mutant("long path", b"{}", tuple(flags)), work / "c.yaml")
    assert o.code == 2 and "not found" in o.err and len(o.err) < 300, o.err


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        ({"num_hidden_layers": 1.5}, "num_hidden_layers must be an integer in [1, 1024], got 1.5"),
        ({"hidden_size": -64}, "hidden_size must be an integer in [1, 1048576], got -64"),
        ({"rms_norm_eps": "x"}, "rms_norm_eps: expected a finite number, got 'x'"),
        ({"hidden_act": 5}, "hidden_act: expected a str, got 5"),
        ({"k" * 5000: 1}, "unknown model override 'kkk"),
    ],
)
def test_hf_overrides_through_build_model(tmp_path: Path, overrides: dict, needle: str) -> None:
    transformers = pytest.importorskip("transformers")
    transformers.LlamaConfig(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, vocab_size=320
    ).save_pretrained(tmp_path)
    one = build_model(hf=str(tmp_path), overrides={"num_hidden_layers": 1}, random_init=True)
    assert one.num_params > 0
    with pytest.raises(UserError) as e:
        build_model(hf=str(tmp_path), overrides=overrides)
    assert needle in str(e.value) and len(str(e.value)) < 400, str(e.value)[:500]
