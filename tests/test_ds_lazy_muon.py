"""DeepSpeed's Muon module imported without compiling at import time
(`zerofit.backends.deepspeed.lazy_muon`): every ZeRO optimizer imports it, and its import wrapped
a function in `torch.compile`, importing Inductor (~2.2 s a rank before the first step). Each
check runs in a fresh interpreter: what a process has imported is the thing measured."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytest.importorskip("deepspeed")

PROBE = """
import json, sys
from zerofit.backends.deepspeed.lazy_muon import import_muon_lazily
lazy = {lazy}
first = import_muon_lazily() if lazy else None
import deepspeed.runtime.zero.muon.muon_optimizer
from deepspeed.runtime.zero.muon import original_muon
from deepspeed.runtime import compiler
print(json.dumps({{
    "first": first,
    "again": import_muon_lazily(),
    "inductor": "torch._inductor.compile_fx" in sys.modules,
    "deferred": original_muon.zeropower_via_newtonschulz5.__code__.co_filename.endswith("lazy_muon.py"),
    "restored": compiler.compile() is not None and compiler.compile.__module__ == compiler.__name__,
}}))
"""


def _imported(lazy: bool) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", PROBE.format(lazy=lazy)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_muon_imports_without_inductor_and_deepspeeds_compile_is_put_back() -> None:
    found = _imported(lazy=True)
    assert found["first"] is True and found["again"] is False  # once a process
    assert not found["inductor"]  # nothing compiled, nothing of Inductor imported
    assert found["deferred"]  # the function compiles on its first call instead
    assert found["restored"]  # DeepSpeed's own compile() for everything else


def test_without_it_importing_muon_imports_inductor() -> None:
    """The cost the module avoids, in this DeepSpeed: a plain import pulls Inductor in."""
    found = _imported(lazy=False)
    assert found["inductor"] and not found["deferred"]
