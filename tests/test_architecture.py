"""The house rules, checked on the source: packages by concern, no import cycles (dynamic imports
included), engine names only inside the engines, typed boundaries, files and functions of a
readable size.

Imports are read with `ast` (no module is executed). Every `import` counts, at module level or
inside a function (a late import hides a cycle from Python, not from a reader), except those under
`if TYPE_CHECKING:`. Each module is a node; `zerofit.a.b` importing `zerofit.c` adds an edge. So
does every string constant that names a zerofit module (`"zerofit.backends.fsdp.runtime"`, or
`"module:Class"`): that is what a registry hands to `importlib`, and `importlib` is only ever
called on such a string (`test_dynamic_imports_are_visible`).
"""

from __future__ import annotations

import ast
import io
import re
import subprocess
import sys
import tokenize
from pathlib import Path

import pytest
import tomllib

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = SRC / "zerofit"
MAX_FILE_LINES = 400
MAX_FUNCTION_LINES = 60
MODULE_NAME = re.compile(r"\bzerofit(?:\.[a-z_][a-z0-9_]*)+")
ENGINE_NAME = re.compile(r"\b(ddp|fsdp|deepspeed)\b")
TOP_LEVEL = {"__init__.py", "cli.py", "errors.py"}


def _module_name(path: Path) -> str:
    parts = path.relative_to(SRC).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _type_checking_lines(tree: ast.AST) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.body:
                lines.update(range(child.lineno, (child.end_lineno or child.lineno) + 1))
    return lines


def _resolve(name: str, known: dict[str, Path]) -> str | None:
    """The module a dotted import names: itself, or the package holding the imported name."""
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def _process_entry_points(tree: ast.AST) -> set[int]:
    """Constants after "-m"/"--module" in a command line (a list literal)."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.List | ast.Tuple):
            for flag, value in zip(node.elts, node.elts[1:], strict=False):
                if isinstance(flag, ast.Constant) and flag.value in ("-m", "--module"):
                    out.add(id(value))
    return out


def _string_targets(tree: ast.AST, known: dict[str, Path]) -> set[str]:
    """The zerofit modules named by string constants (dynamic import targets). Docstrings are
    prose, and `python -m zerofit.x` starts a process: neither imports."""
    out = set()
    skip = _docstrings(tree) | _process_entry_points(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            for match in MODULE_NAME.finditer(node.value):
                if match.group(0) in known:
                    out.add(match.group(0))
    return out


def import_graph() -> dict[str, set[str]]:
    known = _modules()
    graph: dict[str, set[str]] = {name: set() for name in known}
    for name, path in known.items():
        tree = ast.parse(path.read_text())
        skip = _type_checking_lines(tree)
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(tree):
            if getattr(node, "lineno", None) in skip:
                continue
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*up, base] if base else up)
                targets = [f"{base}.{a.name}" for a in node.names] + [base]
            for target in targets:
                if target.startswith("zerofit"):
                    found = _resolve(target, known)
                    if found and found != name:
                        graph[name].add(found)
        graph[name] |= _string_targets(tree, known) - {name}
    return graph


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return out


def test_no_import_cycles() -> None:
    cycles = find_cycles(import_graph())
    assert not cycles, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def test_the_cycle_finder_finds_cycles() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert find_cycles(graph) == [["a", "b", "c"]]
    assert find_cycles({"a": {"b"}, "b": set()}) == []


def _reach(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [m for m in graph if m == start or m.startswith(start + ".")]
    while todo:
        module = todo.pop()
        if module not in seen:
            seen.add(module)
            todo += graph[module]
    return seen


def test_the_graph_sees_registry_strings() -> None:
    """An engine's runtime is reached only through its spec's `runtime_module` string."""
    graph = import_graph()
    assert "zerofit.backends.fsdp.runtime" in graph["zerofit.backends.fsdp.spec"]
    assert "zerofit.backends.deepspeed.checkpoint" in graph["zerofit.backends.deepspeed.spec"]


def test_dynamic_imports_are_visible() -> None:
    """`importlib.import_module` / `__import__` only on a name the graph can see: a constant, or
    an attribute of an engine spec (whose strings are constants there). The unpickler's allowlist
    imports torch's modules, never zerofit's."""
    allowed = {
        "zerofit/backends/engine.py",  # an engine's runtime_module / checkpoint_reader strings
        "zerofit/checkpoint/safe_load.py",  # the unpickler's allowlist: torch.* modules
        "zerofit/backends/deepspeed/checkpoint.py",  # DeepSpeed's plain-data record classes
    }
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        rel = str(path.relative_to(SRC))
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                name = ast.unparse(node.func)
                dynamic = name.endswith("import_module") or name == "__import__"
                if dynamic and not isinstance(node.args[0], ast.Constant) and rel not in allowed:
                    offenders.append(f"{rel}:{node.lineno}")
    assert not offenders, offenders


def test_config_knows_no_engine_and_engines_know_no_planner() -> None:
    graph = import_graph()
    assert not {m for m in _reach(graph, "zerofit.config") if m.startswith("zerofit.backends")}
    assert not {m for m in _reach(graph, "zerofit.backends") if m.startswith("zerofit.planner")}


def test_the_top_level_holds_only_the_entry_point() -> None:
    loose = {p.name for p in PACKAGE.glob("*.py")} - TOP_LEVEL
    assert not loose, f"modules outside a package: {sorted(loose)}"
    for package in PACKAGE.iterdir():
        if package.is_dir() and package.name != "__pycache__":
            doc = ast.get_docstring(ast.parse((package / "__init__.py").read_text()))
            assert doc, f"{package.name}/__init__.py says what the package holds"


def _docstrings(tree: ast.AST) -> set[int]:
    kinds = ast.Module | ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef
    return {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, kinds) and node.body and isinstance(node.body[0], ast.Expr)
    }


def engine_name_strings(path: Path) -> list[str]:
    """String constants (docstrings aside) naming an engine: comparisons, defaults, messages."""
    tree = ast.parse(path.read_text())
    docs = _docstrings(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            text = node.value
        elif isinstance(node, ast.Attribute):  # cfg.parallel.fsdp
            text = node.attr
        elif isinstance(node, ast.Import | ast.ImportFrom):  # import deepspeed
            text = " ".join([getattr(node, "module", None) or "", *(a.name for a in node.names)])
            text = text.strip()
        else:
            continue
        if ENGINE_NAME.search(text.split("zerofit.backends")[0]):
            found.append(f"{path.relative_to(SRC)}:{node.lineno}: {text[:60]!r}")
    return found


def test_engine_names_appear_only_inside_the_engines() -> None:
    """No `"fsdp"` outside zerofit/backends/: not in a comparison, a default, a message or an
    example; the rest asks the registry (`zerofit.backends.catalog`)."""
    offenders = [
        line
        for name, path in _modules().items()
        if not name.startswith("zerofit.backends")
        for line in engine_name_strings(path)
    ]
    assert not offenders, offenders


def test_the_engine_name_finder_finds_them(tmp_path: Path) -> None:
    probe = SRC / "zerofit" / "_probe_engine_names.py"
    try:
        probe.write_text(
            '"""fsdp in a docstring is prose."""\nimport deepspeed\n'
            'X = {"backend": "fsdp"}\nY = cfg.parallel.ddp\n'
        )
        found = engine_name_strings(probe)
    finally:
        probe.unlink()
    assert sorted(f.split(": ", 1)[1] for f in found) == ["'ddp'", "'deepspeed'", "'fsdp'"], found


def test_no_private_name_is_imported_across_modules() -> None:
    offenders = []
    for name, path in _modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("zerofit"):
                private = [
                    a.name for a in node.names if a.name.startswith("_") and a.name != "__version__"
                ]
                if private:
                    offenders.append(f"{name}:{node.lineno} {private}")
    assert not offenders, offenders


TORCH_FREE = """
import sys
import tomllib
sys.argv = ["zerofit", *sys.argv[1:]]
import zerofit.planner.plan, zerofit.planner.auto
from zerofit.cli import main
try:
    code = main()
except SystemExit as e:
    code = e.code
assert "torch" not in sys.modules, "torch was imported"
sys.exit(code)
"""


@pytest.mark.parametrize(
    "args",
    [
        ["plan", "--preset", "llama3-8b", "--gpus", "2", "--gpu", "RTX 4090"],
        ["config", "show", "--parallel.backend", "deepspeed"],
        ["config", "schema"],
        ["ds-config", "--nproc", "4"],
    ],
    ids=["plan", "config-show", "config-schema", "ds-config"],
)
def test_planning_commands_run_without_torch(args: list[str]) -> None:
    """`zerofit plan`, `config` and `ds-config` import no torch: they run on a laptop. A GPU
    machine's driver list is hidden from the probe (CUDA_VISIBLE_DEVICES=-1), as on a laptop."""
    env = {"CUDA_VISIBLE_DEVICES": "-1", "PATH": "/usr/bin:/bin", "PYTHONPATH": str(SRC)}
    out = subprocess.run(
        [sys.executable, "-c", TORCH_FREE, *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-2000:]


def test_files_stay_readable() -> None:
    long = {
        str(p.relative_to(SRC)): n
        for p in PACKAGE.rglob("*.py")
        if (n := len(p.read_text().splitlines())) > MAX_FILE_LINES
    }
    assert not long, long


@pytest.mark.parametrize("path", sorted(PACKAGE.rglob("*.py")), ids=lambda p: p.name)
def test_functions_stay_readable(path: Path) -> None:
    long = [
        f"{node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES
    ]
    assert not long, long


def test_one_version_number() -> None:
    """`zerofit --version` is pyproject.toml's version, read from the installed metadata."""
    declared = tomllib.loads((SRC.parent / "pyproject.toml").read_text())["project"]["version"]
    out = subprocess.run(
        [sys.executable, "-m", "zerofit.cli", "--version"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.stdout.strip() == f"zerofit {declared}", out.stderr[-500:]
    assert not re.search(r"__version__\s*=\s*['\"]\d", (PACKAGE / "__init__.py").read_text())


# ----------------------------------------------------------------------------- typed boundaries

BOUNDARY_NAMES = {"cfg", "config", "opts", "options", "prep"}  # a config, options, a prepared run
TYPING_UNIONS = {"Optional", "Union", "typing.Optional", "typing.Union"}


def _comment_lines(text: str) -> tuple[set[int], set[int]]:
    """Lines holding a comment, and lines holding nothing else (tokenize: a '#' in a string is
    no comment)."""
    anywhere, alone = set(), set()
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == tokenize.COMMENT:
            anywhere.add(tok.start[0])
            if not tok.line[: tok.start[1]].strip():
                alone.add(tok.start[0])
    return anywhere, alone


def unexplained_local_imports(path: Path) -> list[str]:
    """Imports inside a function with no comment on their first or last line, nor on a line of
    its own just above: a late import says why (an optional dependency, a torch-free path)."""
    text = path.read_text()
    commented, comment_only = _comment_lines(text)
    found, seen = [], set()
    for fn in ast.walk(ast.parse(text)):
        if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        for node in ast.walk(fn):
            if isinstance(node, ast.Import | ast.ImportFrom) and node.lineno not in seen:
                seen.add(node.lineno)
                said = {node.lineno, node.end_lineno or node.lineno} & commented
                if not said and node.lineno - 1 not in comment_only:
                    found.append(f"{path.name}:{node.lineno} in {fn.name}: {ast.unparse(node)}")
    return found


def test_every_function_local_import_says_why() -> None:
    offenders = [line for path in PACKAGE.rglob("*.py") for line in unexplained_local_imports(path)]
    assert not offenders, "\n".join(offenders)


def test_the_local_import_finder_finds_them(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text(
        "import os\n\n\n"
        "def f():\n"
        "    import json\n"
        "    import torch  # torch-free path: the CLI imports this module\n"
        "    # optional: deepspeed\n"
        "    import deepspeed\n"
        "    from a import (  # optional: a\n        b,\n    )\n"
        "    from c import (\n        d,\n    )  # optional: c\n"
        '    x = "# not a comment"; import yaml\n'
        "    from e import (\n        f,\n    )\n\n"
        "    def inner():\n        import re\n"
    )
    found = [line.split(": ", 1)[1] for line in unexplained_local_imports(probe)]
    assert found == ["import json", "import yaml", "from e import f", "import re"], found


def _is_any(annotation: ast.expr | None) -> bool:
    """`Any` itself, or `Any` as one member of a union (`Any | None`, `Optional[Any]`); not
    `Mapping[str, Any]`, which says what the thing is."""
    node = annotation
    if isinstance(node, ast.Constant) and isinstance(node.value, str):  # a quoted annotation
        node = ast.parse(node.value, mode="eval").body
    if isinstance(node, ast.Name | ast.Attribute):
        return ast.unparse(node) in ("Any", "typing.Any")
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return _is_any(node.left) or _is_any(node.right)
    if isinstance(node, ast.Subscript) and ast.unparse(node.value) in TYPING_UNIONS:
        members = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        return any(_is_any(m) for m in members)
    return False


def untyped_boundaries(path: Path) -> list[str]:
    """Parameters and attributes named for a config, options or a prepared run (`cfg`, `config`,
    `opts`, `options`, `prep`) that are annotated `Any`."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        named: list[tuple[str, ast.expr | None, int]] = []
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            a = node.args
            params = [*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg]
            named = [(p.arg, p.annotation, p.lineno) for p in params if p is not None]
        elif isinstance(node, ast.AnnAssign):  # a dataclass field, `self.cfg: ...`, a local
            target = node.target
            name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", "")
            named = [(name, node.annotation, node.lineno)]
        found += [
            f"{path.name}:{line} {name}"
            for name, annotation, line in named
            if name in BOUNDARY_NAMES and _is_any(annotation)
        ]
    return found


def test_configs_options_and_prepared_runs_are_typed() -> None:
    """No `Any` for a run's config, its options (an engine's, the launcher's) or its prepared
    run: `Config`, `LaunchOptions`, an engine's options dataclass, `PreparedRun`; a Hugging Face
    config is a `transformers.PretrainedConfig`."""
    offenders = [line for path in PACKAGE.rglob("*.py") for line in untyped_boundaries(path)]
    assert not offenders, offenders


def test_the_untyped_boundary_finder_finds_them(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text(
        "from typing import Any, Mapping, Optional\n\n\n"
        "def f(cfg: Any, opts: Any | None, x: Any, hf: Any, config: Mapping[str, Any]) -> Any:\n"
        "    prep: Any = None\n"
        "    self.options: Optional[Any] = None\n\n\n"
        "class C:\n"
        '    config: "Any"\n'
        "    cfg: Config\n\n"
        "    def g(self, *opts: int, **options: Any) -> None: ...\n"
    )
    found = [line.split(" ", 1)[1] for line in untyped_boundaries(probe)]
    assert sorted(found) == ["cfg", "config", "options", "options", "opts", "prep"], found
