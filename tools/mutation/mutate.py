"""A small mutation runner for zerofit's pure-logic modules (see docs/mutation-testing.md).

Why not mutmut or cosmic-ray: mutmut 3.x (tried: 3.8.1) only mutates plain functions. It skips
module-level statements (the checkpoint unpickler's allowlist `_DCP_CLASSES`, the YAML tag list,
dtype byte sizes), every decorated function but static/class methods, and every `@property`, which
is where `LoRAInfo.scale` (alpha / rank of the LoRA export) and several planner terms live. Those are
exactly the places this exercise is about, so this runner mutates them too.

How it works, one module at a time (targets in `tools/mutation/targets.toml`):

1. The repository's `src/`, `tests/`, `configs/` and `pyproject.toml` are copied to a scratch
   directory (the working tree is never written to; others may edit it meanwhile).
2. The module is parsed with `ast`; every mutant is one change of one node (operators below), inside
   the functions/classes the target names (or the whole module). Docstrings, annotations,
   decorators, f-strings and the text of error messages are left alone.
3. The unmutated module (`ast.unparse`d, so the baseline runs the very text every mutant is made
   from) must pass the target's tests. Then each mutant is written over the module in the scratch
   copy and the tests run with `-x` in a child forked from a process that has already imported
   torch, numpy and pytest (no zerofit module: the child imports the mutated one afresh, and
   subprocesses the tests start read it from disk). A failing test kills the mutant; a run past
   the time limit is a timeout (counted as detected).

Operators: comparison boundary and negation (< <= > >= == != in / not in, is / is not), arithmetic
swaps (+ -, * /, // /, % /, ** *, << >>, & |) and the same in augmented assignments, and/or, removal
of `not`, True/False, numeric constants +1 and -1, behavioural string constants (not messages)
changed, `return x` -> `return None`, and removal of a `raise`, a call statement, an augmented
assignment, `continue` or `break` (replaced by `pass`).

Usage (from the repository root):
    .venv/bin/python tools/mutation/mutate.py [MODULE_KEY ...] [--list] [--show ID]
Results: tools/mutation/results/<key>.json, summary in tools/mutation/results/summary.{json,md}.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import copy
import datetime as _dt
import hashlib
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import tomllib

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
RESULTS = HERE / "results"
COPY = [
    "src",
    "tests",
    "configs",
    "docs",
    "benchmarks",
    "bench-fixture",
    "README.md",
    "pyproject.toml",
]
# calls whose string arguments are message text (their mutants say nothing about behaviour)
MESSAGE_CALLS = ("Error", "Exception", "_Refused", "print", "warn", "bad", "_no_match", "Warning")

# ----------------------------------------------------------------------------- mutants


@dataclass
class Mutant:
    id: str
    module: str
    scope: str  # qualified name of the function/class, or <module>
    line: int
    operator: str
    original: str
    mutated: str
    status: str = "pending"  # killed | survived | timeout | error
    killed_by: str = ""
    seconds: float = 0.0
    harmless: str = ""  # reason, for a survivor judged harmless (from harmless.toml)


def _is_docstring(node: ast.AST, parent: ast.AST | None) -> bool:
    return (
        isinstance(node, ast.Expr)
        and isinstance(node.value, ast.Constant)
        and isinstance(node.value.value, str)
        and isinstance(parent, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and parent.body
        and parent.body[0] is node
    )


def _call_name(call: ast.Call) -> str:
    f = call.func
    if isinstance(f, ast.Name):
        return f.id
    if isinstance(f, ast.Attribute):
        return f.attr
    return ""


_CMP = {
    ast.Lt: [ast.LtE, ast.GtE],
    ast.LtE: [ast.Lt, ast.Gt],
    ast.Gt: [ast.GtE, ast.LtE],
    ast.GtE: [ast.Gt, ast.Lt],
    ast.Eq: [ast.NotEq],
    ast.NotEq: [ast.Eq],
    ast.In: [ast.NotIn],
    ast.NotIn: [ast.In],
    ast.Is: [ast.IsNot],
    ast.IsNot: [ast.Is],
}
_BIN = {
    ast.Add: [ast.Sub],
    ast.Sub: [ast.Add],
    ast.Mult: [ast.Div],
    ast.Div: [ast.Mult],
    ast.FloorDiv: [ast.Div],
    ast.Mod: [ast.Div],
    ast.Pow: [ast.Mult],
    ast.LShift: [ast.RShift],
    ast.RShift: [ast.LShift],
    ast.BitAnd: [ast.BitOr],
    ast.BitOr: [ast.BitAnd],
    ast.BitXor: [ast.BitAnd],
}
_SKIP_FIELDS = {"annotation", "returns", "decorator_list", "type_comment", "type_params"}


class _Finder:
    """Walks a module and lists (path to a node, replacement maker, operator) for every mutant in
    scope. A path is a list of (field, index) steps from the module, so a mutant is applied to a
    fresh deep copy of the tree."""

    def __init__(self, tree: ast.Module, scopes: list[str] | None) -> None:
        self.tree = tree
        self.scopes = scopes  # None: the whole module
        self.found: list[tuple[list, str, object, str]] = []  # path, operator, payload, scope

    def in_scope(self, qual: str) -> bool:
        if self.scopes is None:
            return True
        return any(qual == s or qual.startswith(s + ".") for s in self.scopes)

    def run(self) -> None:
        self._walk(self.tree, None, [], "<module>", False, False)

    def _walk(
        self,
        node: ast.AST,
        parent: ast.AST | None,
        path: list,
        qual: str,
        message: bool,
        in_fstring: bool,
    ) -> None:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            qual = node.name if qual == "<module>" else f"{qual}.{node.name}"
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            return
        if isinstance(node, ast.ImportFrom | ast.Import):
            return
        if _is_docstring(node, parent):
            return
        if isinstance(node, ast.Call) and _call_name(node).endswith(MESSAGE_CALLS):
            message = True
        if isinstance(node, ast.Raise):
            message = True  # the raised expression's text; the raise itself is still removable
        if isinstance(node, ast.JoinedStr):
            in_fstring = True
        if isinstance(node, ast.keyword) and node.arg == "problem":
            message = True
        active = (
            self.in_scope(qual)
            and qual != "<module>"
            or (qual == "<module>" and (self.scopes is None or "<module>" in self.scopes))
        )
        if active and not in_fstring:
            self._mutants_of(node, path, qual, message)
        for fname, value in ast.iter_fields(node):
            if fname in _SKIP_FIELDS:
                continue
            if isinstance(value, list):
                for i, child in enumerate(value):
                    if isinstance(child, ast.AST):
                        self._walk(child, node, [*path, (fname, i)], qual, message, in_fstring)
            elif isinstance(value, ast.AST):
                self._walk(value, node, [*path, (fname, None)], qual, message, in_fstring)

    def _add(self, path: list, op: str, payload: object, qual: str) -> None:
        self.found.append((path, op, payload, qual))

    def _mutants_of(self, node: ast.AST, path: list, qual: str, message: bool) -> None:
        if isinstance(node, ast.Compare):
            for i, op in enumerate(node.ops):
                for new in _CMP.get(type(op), []):
                    self._add(path, "compare", (i, new), qual)
        elif isinstance(node, ast.BinOp):
            for new in _BIN.get(type(node.op), []):
                self._add(path, "arith", new, qual)
        elif isinstance(node, ast.AugAssign):
            for new in _BIN.get(type(node.op), []):
                self._add(path, "aug-arith", new, qual)
            self._add(path, "remove-stmt", None, qual)
        elif isinstance(node, ast.BoolOp):
            self._add(path, "and-or", None, qual)
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            self._add(path, "remove-not", None, qual)
        elif isinstance(node, ast.Constant):
            v = node.value
            if isinstance(v, bool):
                self._add(path, "bool", None, qual)
            elif isinstance(v, int | float) and not isinstance(v, bool):
                self._add(path, "number+1", 1, qual)
                self._add(path, "number-1", -1, qual)
            elif isinstance(v, str) and not message and v:
                self._add(path, "string", None, qual)
        elif isinstance(node, ast.Return) and node.value is not None:
            if not (isinstance(node.value, ast.Constant) and node.value.value is None):
                self._add(path, "return-none", None, qual)
        elif isinstance(node, ast.Raise | ast.Continue | ast.Break) or (
            isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)
        ):
            self._add(path, "remove-stmt", None, qual)


def _resolve(tree: ast.AST, path: list) -> tuple[ast.AST, str, int | None, ast.AST]:
    parent = tree
    for fname, idx in path[:-1]:
        parent = getattr(parent, fname) if idx is None else getattr(parent, fname)[idx]
    fname, idx = path[-1]
    node = getattr(parent, fname) if idx is None else getattr(parent, fname)[idx]
    return parent, fname, idx, node


def _replace(parent: ast.AST, fname: str, idx: int | None, new: ast.AST) -> None:
    if idx is None:
        setattr(parent, fname, new)
    else:
        getattr(parent, fname)[idx] = new


def _apply(node: ast.AST, op: str, payload: object) -> ast.AST:
    """The mutated copy of `node` (already a copy)."""
    if op == "compare":
        i, new = payload
        node.ops[i] = new()
    elif op in ("arith", "aug-arith"):
        node.op = payload()
    elif op == "and-or":
        node.op = ast.Or() if isinstance(node.op, ast.And) else ast.And()
    elif op == "remove-not":
        return node.operand
    elif op == "bool":
        node.value = not node.value
    elif op.startswith("number"):
        node.value = node.value + payload
    elif op == "string":
        node.value = "XX" + node.value + "XX"
    elif op == "return-none":
        node.value = ast.Constant(None)
    elif op == "remove-stmt":
        return ast.Pass()
    return node


def find_mutants(source: str, module: str, scopes: list[str] | None) -> tuple[str, list]:
    """(the baseline text, [(Mutant, mutated module text)])."""
    tree = ast.parse(source)
    baseline = ast.unparse(tree)
    finder = _Finder(tree, scopes)
    finder.run()
    out = []
    seen: dict[str, int] = {}
    for path, op, payload, qual in finder.found:
        t = copy.deepcopy(tree)
        parent, fname, idx, node = _resolve(t, path)
        original = ast.unparse(node)
        line = getattr(node, "lineno", None) or getattr(parent, "lineno", 0)
        new = _apply(node, op, payload)
        _replace(parent, fname, idx, new)
        ast.fix_missing_locations(t)
        try:
            text = ast.unparse(t)
            compile(text, module, "exec")
        except (SyntaxError, ValueError, TypeError):
            continue
        if text == baseline:
            continue
        mutated = ast.unparse(new)
        key = f"{module}|{qual}|{op}|{original}|{mutated}"
        n = seen.get(key, 0)
        seen[key] = n + 1
        mid = hashlib.sha1(f"{key}|{n}".encode()).hexdigest()[:10]
        short = lambda s: s if len(s) <= 160 else s[:157] + "..."  # noqa: E731
        out.append((Mutant(mid, module, qual, line, op, short(original), short(mutated)), text))
    return baseline, out


# ----------------------------------------------------------------------------- running


@dataclass
class Target:
    key: str
    path: str
    tests: list[str]  # existing fast tests
    guards: list[str]  # the tests/test_guards_*.py written for this module
    scopes: list[str] | None = None
    timeout_floor: float = 20.0
    mutants: list[Mutant] = field(default_factory=list)


def load_targets() -> list[Target]:
    data = tomllib.loads((HERE / "targets.toml").read_text())
    return [
        Target(
            key,
            t["path"],
            list(t.get("tests", [])),
            list(t.get("guards", [])),
            t.get("scopes"),
            float(t.get("timeout_floor", 20.0)),
        )
        for key, t in data["targets"].items()
    ]


def load_harmless() -> dict[str, str]:
    path = HERE / "harmless.toml"
    if not path.exists():
        return {}
    return {k: v["reason"] for k, v in tomllib.loads(path.read_text()).get("mutant", {}).items()}


def snapshot(dest: Path) -> None:
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".pytest_cache")
    for name in COPY:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, dest / name, ignore=ignore)
        elif src.exists():
            shutil.copy2(src, dest / name)


def _preload() -> None:
    """What every child would import anyway (nothing of zerofit)."""
    import numpy  # noqa: F401
    import pydantic  # noqa: F401
    import pytest  # noqa: F401
    import torch  # noqa: F401
    import yaml  # noqa: F401

    with contextlib.suppress(ImportError):
        import safetensors.torch  # noqa: F401


def run_tests(work: Path, tests: list[str], timeout: float, log: Path) -> tuple[str, str, float]:
    """Fork a child that runs pytest on `tests` in `work`: (status, first failing test, seconds)."""
    args = ["-x", "-q", "-p", "no:cacheprovider", "-o", "addopts=", "-rfE", "--no-header", *tests]
    start = time.monotonic()
    pid = os.fork()
    if pid == 0:  # child
        try:
            os.setsid()
            fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(fd, 1)
            os.dup2(fd, 2)
            os.chdir(work)
            sys.dont_write_bytecode = True
            import pytest

            rc = pytest.main(args)
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(int(rc))
        except BaseException:  # noqa: BLE001
            import traceback

            traceback.print_exc()
            sys.stderr.flush()
            os._exit(99)
    status = None
    while True:
        done, code = os.waitpid(pid, os.WNOHANG)
        if done:
            rc = os.waitstatus_to_exitcode(code)
            break
        if time.monotonic() - start > timeout:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            status, rc = "timeout", None
            break
        time.sleep(0.05)
    seconds = time.monotonic() - start
    text = log.read_text(errors="replace") if log.exists() else ""
    failed = next(
        (
            ln.split(" ", 1)[1].split(" - ")[0]
            for ln in text.splitlines()
            if ln.startswith(("FAILED ", "ERROR "))
        ),
        "",
    )
    if status == "timeout":
        return status, "", seconds
    if rc == 0:
        return "survived", "", seconds
    if rc == 1:
        return "killed", failed, seconds
    # 2: interrupted (an import/collection error), 3: internal error, 4: usage, 5: no tests...
    return ("killed" if rc in (2, 3) else "error"), failed or f"pytest exit {rc}", seconds


def module_name(path: str) -> str:
    return Path(path).with_suffix("").as_posix().removeprefix("src/").replace("/", ".")


def run_target(
    t: Target,
    work: Path,
    harmless: dict[str, str],
    only: set[str] | None,
    before: bool,
    previous: dict | None = None,
    sample: int = 1,
) -> dict:
    """Run every mutant of `t`; with `previous` (its last results), only those that survived
    there unjudged, or are new (adding tests cannot revive a killed mutant of the same source;
    a survivor judged harmless in harmless.toml keeps its status)."""
    rel = Path(t.path)
    tests = t.tests if before else [*t.guards, *t.tests]  # the focused (fast) ones first
    if not any(not a.startswith("-") for a in tests):
        print(f"[{t.key}] no fast test selected: skipped")
        return {"key": t.key, "path": t.path, "error": "no fast test exercises it", "tests": []}
    target_file = work / rel
    source = (ROOT / rel).read_text()
    module = module_name(t.path)
    baseline, mutants = find_mutants(source, module, t.scopes)
    mutants = mutants[::sample]  # --sample N: every N-th mutant only (said in the results)
    logs = Path(tempfile.mkdtemp(prefix=f"mut-{t.key}-"))
    target_file.write_text(baseline)
    status, failed, base_s = run_tests(work, tests, 600, logs / "baseline.log")
    if status != "survived":
        print(f"[{t.key}] baseline FAILED ({failed}); see {logs / 'baseline.log'}")
        target_file.write_text(source)
        return {"key": t.key, "error": f"baseline failed: {failed}", "log": str(logs)}
    limit = max(t.timeout_floor, 3 * base_s + 10)
    print(
        f"[{t.key}] {len(mutants)} mutants; baseline {base_s:.1f}s; limit {limit:.0f}s", flush=True
    )
    done = {}
    if previous is not None:
        done = {
            r["id"]: r
            for r in previous["results"]
            if r["status"] in ("killed", "timeout") or r["id"] in harmless
        }
        print(
            f"[{t.key}] rerun: {len(done)} killed or judged harmless before are kept, "
            "the rest run again"
        )
    for n, (m, text) in enumerate(mutants, 1):
        if only and m.id not in only:
            continue
        if m.id in done:
            m.status, m.killed_by, m.seconds = (
                done[m.id][k] for k in ("status", "killed_by", "seconds")
            )
            continue
        target_file.write_text(text)
        log = logs / f"{m.id}.log"
        if not before and t.guards:  # the focused tests alone first: they collect in a second
            m.status, m.killed_by, m.seconds = run_tests(work, t.guards, limit, log)
            if m.status == "survived":  # then all of them, as the baseline ran
                status, failed, seconds = run_tests(work, tests, limit, log)
                m.status, m.killed_by, m.seconds = status, failed, m.seconds + seconds
        else:
            m.status, m.killed_by, m.seconds = run_tests(work, tests, limit, log)
        if m.status == "survived":
            m.harmless = harmless.get(m.id, "")
        else:
            (logs / f"{m.id}.log").unlink(missing_ok=True)
        mark = {"killed": ".", "timeout": "T", "survived": "S", "error": "E"}[m.status]
        print(
            f"  {n:4d}/{len(mutants)} {mark} {m.id} {m.scope}:{m.line} {m.operator} "
            f"{m.original[:60]!r} -> {m.mutated[:60]!r} ({m.seconds:.1f}s) {m.killed_by}",
            flush=True,
        )
    target_file.write_text(source)
    t.mutants = [m for m, _ in mutants]
    counts = {
        s: sum(m.status == s for m in t.mutants) for s in ("killed", "survived", "timeout", "error")
    }
    return {
        "key": t.key,
        "path": t.path,
        "scopes": t.scopes,
        "tests": tests,
        "baseline_seconds": round(base_s, 2),
        "mutants": len(t.mutants),
        **counts,
        "harmless": sum(bool(m.harmless) for m in t.mutants if m.status == "survived"),
        "results": [asdict(m) for m in t.mutants],
    }


def write_summary(results: Path) -> None:
    """summary.{json,md} and survivors.md of a results folder, harmless.toml applied afresh."""
    harmless = load_harmless()
    rows = []
    for f in sorted(results.glob("*.json")):
        if f.name == "summary.json":
            continue
        r = json.loads(f.read_text())
        if "results" in r:
            for m in r["results"]:
                m["harmless"] = harmless.get(m["id"], "") if m["status"] == "survived" else ""
            r["harmless"] = sum(bool(m["harmless"]) for m in r["results"])
            f.write_text(json.dumps(r, indent=1) + "\n")
        if "results" not in r:
            rows.append(
                {
                    "key": r["key"],
                    "path": r.get("path"),
                    "mutants": 0,
                    "killed": 0,
                    "survived": 0,
                    "timeout": 0,
                    "error": 0,
                    "harmless": 0,
                    "date": r.get("date"),
                    "note": r.get("error", ""),
                }
            )
            continue
        rows.append(
            {
                k: r.get(k)
                for k in (
                    "key",
                    "path",
                    "mutants",
                    "killed",
                    "survived",
                    "timeout",
                    "error",
                    "harmless",
                    "date",
                )
            }
        )
        if r.get("sampled_every"):
            rows[-1]["key"] = f"{r['key']} (every {r['sampled_every']}th mutant)"
    tot = {
        k: sum(r[k] or 0 for r in rows)
        for k in ("mutants", "killed", "survived", "timeout", "error", "harmless")
    }
    (results / "summary.json").write_text(
        json.dumps({"modules": rows, "total": tot}, indent=1) + "\n"
    )
    lines = [
        "| module | mutants | killed | timeout | survived | of which harmless | error | killed % "
        "| killed % of non-equivalent |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in [*rows, {"key": "**total**", **tot}]:
        n = r["mutants"] or 0
        if r.get("note"):
            lines.append(f"| {r['key']} | - | - | - | - | - | - | - | {r['note']} |")
            continue
        det = (r["killed"] + r["timeout"]) / n * 100 if n else 0.0
        real = n - r["harmless"]
        det2 = (r["killed"] + r["timeout"]) / real * 100 if real else 0.0
        lines.append(
            f"| {r['key']} | {n} | {r['killed']} | {r['timeout']} | {r['survived']} | "
            f"{r['harmless']} | {r['error']} | {det:.1f} | {det2:.1f} |"
        )
    (results / "summary.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    survivors = [
        "| module | id | where | mutant | judged harmless because |",
        "| --- | --- | --- | --- | --- |",
    ]
    for f in sorted(results.glob("*.json")):
        if f.name == "summary.json":
            continue
        r = json.loads(f.read_text())
        for m in r.get("results", []):
            if m["status"] != "survived":
                continue
            change = f"`{m['original']}` → `{m['mutated']}`".replace("|", "\\|")
            why = (m["harmless"] or "**not judged: a gap**").replace("|", "\\|")
            survivors.append(
                f"| {r['key']} | {m['id']} | {m['scope']}:{m['line']} ({m['operator']}) | {change} | {why} |"
            )
    (results / "survivors.md").write_text("\n".join(survivors) + "\n")


def run_planted(work: Path, targets: list[Target]) -> dict:
    """Apply each bug of planted.toml to the scratch copy; run its target's tests without and with
    the guards. Returns {bug name: {"existing": (status, test), "with guards": (status, test)}}."""
    by_key = {t.key: t for t in targets}
    bugs = tomllib.loads((HERE / "planted.toml").read_text())["bug"]
    logs = Path(tempfile.mkdtemp(prefix="mut-planted-"))
    out = {}
    for i, bug in enumerate(bugs):
        t = by_key[bug["target"]]
        path = work / bug["file"]
        source = path.read_text()
        if source.count(bug["old"]) != 1:
            print(f"[planted] {bug['name']}: the text to replace is not in {bug['file']} once")
            out[bug["name"]] = {"error": "text not found"}
            continue
        path.write_text(source.replace(bug["old"], bug["new"]))
        row = {}
        for label, tests in (("existing", t.tests), ("with guards", [*t.guards, *t.tests])):
            if not any(not a.startswith("-") for a in tests):
                row[label] = ["no fast test", ""]
                continue
            status, failed, _ = run_tests(work, tests, 600, logs / f"{i}-{label[0]}.log")
            row[label] = ["caught" if status in ("killed", "timeout") else "missed", failed]
        path.write_text(source)
        out[bug["name"]] = row
        print(f"[planted] {bug['name']}: {row}", flush=True)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("keys", nargs="*", help="target keys of targets.toml (default: all)")
    ap.add_argument("--list", action="store_true", help="list the mutants, run nothing")
    ap.add_argument("--only", nargs="*", help="run only these mutant ids")
    ap.add_argument("--summary", action="store_true", help="rewrite the summary only")
    ap.add_argument("--no-save", action="store_true", help="do not write results/")
    ap.add_argument(
        "--planted", action="store_true", help="run the hand-planted bugs of planted.toml only"
    )
    ap.add_argument(
        "--sample", type=int, default=1, help="run every N-th mutant only (results say so)"
    )
    ap.add_argument(
        "--rerun-survivors",
        action="store_true",
        help="keep the mutants the last results killed; run only the survivors and new ones",
    )
    ap.add_argument(
        "--before",
        action="store_true",
        help="existing tests only (no tests/test_guards_*.py); results in results/before/",
    )
    args = ap.parse_args()
    results = RESULTS / ("before" if args.before else "after")
    if args.summary:
        write_summary(results)
        return 0
    targets = load_targets()
    if args.keys:
        unknown = set(args.keys) - {t.key for t in targets}
        if unknown:
            ap.error(f"unknown target(s): {', '.join(sorted(unknown))}")
        targets = [t for t in targets if t.key in args.keys]
    if args.list:
        for t in targets:
            _, ms = find_mutants((ROOT / t.path).read_text(), module_name(t.path), t.scopes)
            print(f"[{t.key}] {len(ms)} mutants")
            for m, _ in ms:
                print(f"  {m.id} {m.scope}:{m.line} {m.operator} {m.original!r} -> {m.mutated!r}")
        return 0
    harmless = load_harmless()
    work = Path(tempfile.mkdtemp(prefix="zerofit-mutation-"))
    snapshot(work)
    sys.path.insert(0, str(work / "src"))
    os.environ["PYTHONPATH"] = str(work / "src") + os.pathsep + os.environ.get("PYTHONPATH", "")
    os.environ["PYTHONDONTWRITEBYTECODE"] = "1"
    _preload()
    results.mkdir(parents=True, exist_ok=True)
    try:
        if args.planted:
            found = run_planted(work, load_targets())
            if not args.no_save:
                (RESULTS / "planted.json").write_text(json.dumps(found, indent=1) + "\n")
            return 0
        for t in targets:
            previous = None
            last = results / f"{t.key}.json"
            if args.rerun_survivors and last.exists():
                previous = json.loads(last.read_text())
                previous = previous if "results" in previous else None
            only = set(args.only) if args.only else None
            r = run_target(t, work, harmless, only, args.before, previous, args.sample)
            if args.sample > 1:
                r["sampled_every"] = args.sample
            if previous is not None:
                r["rerun_of_survivors"] = True
            r["date"] = _dt.date.today().isoformat()
            if not args.no_save and not args.only:
                (results / f"{t.key}.json").write_text(json.dumps(r, indent=1) + "\n")
            if "results" in r:
                print(
                    f"[{t.key}] killed {r['killed']}, timeout {r['timeout']}, survived "
                    f"{r['survived']} ({r['harmless']} judged harmless), error {r['error']} "
                    f"of {r['mutants']}",
                    flush=True,
                )
                for m in r["results"]:
                    if m["status"] == "survived":
                        tag = f"  [harmless: {m['harmless']}]" if m["harmless"] else ""
                        print(
                            f"    S {m['id']} {m['scope']}:{m['line']} {m['operator']} "
                            f"{m['original']!r} -> {m['mutated']!r}{tag}"
                        )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if not args.no_save and not args.only:
        write_summary(results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
