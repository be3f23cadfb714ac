"""A normal run, resume, export or plan prints no third-party warning lines; each filter drops
exactly its one message (`zerofit.report.quiet`)."""

from __future__ import annotations

import io
import logging
import re
import shutil
import subprocess
import warnings
from pathlib import Path

import pytest
from conftest import deep_update, shared_extra, write_config, zerofit

from zerofit.report import quiet

# What a library's own warning or notice looks like in a run's output.
NOISE = re.compile(
    r"\[WARNING\]|Warning: |warnings\.warn|Failed to load |built successfully|^[WE]\d{4} |"
    r"is deprecated|FutureWarning|UserWarning",
    re.M,
)


def _record(name: str, msg: str, module: str = "x") -> logging.LogRecord:
    record = logging.LogRecord(name, logging.WARNING, f"{module}.py", 1, msg, None, None)
    record.module = module
    return record


def test_each_filter_drops_its_message_and_nothing_else() -> None:
    drop = [
        _record("torchao", "Failed to load %s: %s"),
        _record("DeepSpeed", "Setting accelerator to CPU. If you have GPU...", "real_accelerator"),
        _record(
            "torch.utils._pytree",
            "<enum 'X'> is an Enum subclass and is now natively "
            "supported by torch.compile as an opaque value type. Calling ...",
        ),
    ]
    keep = [
        _record("torchao", "float8 is slow here"),
        _record("DeepSpeed", "Setting accelerator to CPU.", "engine"),  # another module's line
        _record("DeepSpeed", "overflow, skipping step", "real_accelerator"),
        _record("torch.utils._pytree", "something else"),
    ]
    assert [quiet._FILTER.filter(r) for r in drop] == [False] * len(drop)
    assert [quiet._FILTER.filter(r) for r in keep] == [True] * len(keep)


def test_install_puts_the_filter_on_each_logger_once() -> None:
    quiet.install()
    quiet.install()
    for name in quiet.LOGGERS:
        assert logging.getLogger(name).filters.count(quiet._FILTER) == 1


def test_deepspeed_setup_drops_only_the_build_line(capsys: pytest.CaptureFixture[str]) -> None:
    with quiet.deepspeed_setup():
        print("DeepSpeed deepspeed.ops.comm.deepspeed_shm_comm_op built successfully")
        print("a line of the run")
        print("DeepSpeed op built successfully, and more")  # not the whole line: kept
        print("no newline at the end", end="")
    assert capsys.readouterr().out == (
        "a line of the run\nDeepSpeed op built successfully, and more\nno newline at the end"
    )


def test_single_process_dcp_drops_only_that_warning() -> None:
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with quiet.single_process_dcp():
            warnings.warn(
                "torch.distributed is disabled, unavailable or uninitialized, assuming the intent "
                "is to load in a single process.",
                UserWarning,
                stacklevel=1,
            )
            warnings.warn("another warning", UserWarning, stacklevel=1)
    assert [str(w.message) for w in seen] == ["another warning"]


def test_weights_only_loads_drop_the_protocol_notice_and_nothing_else(tmp_path: Path) -> None:
    """A pickle of protocol 4 (Python's default, which other tools write) that torch's weights-only
    unpickler cannot read: both of zerofit's readers refuse it in one line, without torch's
    protocol notice before it."""
    import torch

    from zerofit.checkpoint.safe_load import load_torch_file
    from zerofit.errors import UserError
    from zerofit.models.hf_weights import _load_bin

    path = tmp_path / "pytorch_model.bin"
    torch.save({"w": torch.ones(2)}, path, pickle_protocol=4)
    for load in (load_torch_file, _load_bin):
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            with pytest.raises(UserError):
                load(str(path))
        assert not [str(w.message) for w in seen if "protocol" in str(w.message)], load
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with quiet.weights_only_load():
            warnings.warn("Detected pickle protocol 4 in the checkpoint", UserWarning, stacklevel=1)
            warnings.warn("another warning", UserWarning, stacklevel=1)
    assert [str(w.message) for w in seen] == ["another warning"]


def _quiet(proc) -> None:  # noqa: ANN001 - a CompletedProcess
    assert proc.returncode == 0, proc.stderr[-3000:]
    noise = NOISE.findall(proc.stdout + proc.stderr)
    assert not noise, (noise, proc.stdout[-2000:], proc.stderr[-3000:])


@pytest.mark.dist
@pytest.mark.slow
def test_train_resume_across_engines_export_and_plan_print_no_library_noise(
    tmp_path: Path,
    shared_run,  # noqa: ANN001
) -> None:
    """DeepSpeed trains (conftest's shared ZeRO-2 run, whose output is kept: its one line on rank
    0), FSDP resumes its checkpoint (a single-process DCP read in the launcher, DeepSpeed's
    reader), the result exports; none prints a library's warning."""
    out, err = shared_run.output("zero2@2")  # exit 0: shared_run asserts it
    _quiet(subprocess.CompletedProcess("zero2@2", 0, out, err))
    assert len(re.findall(r"^deepspeed \S+: ZeRO-2 on its cpu accelerator$", out, re.M)) == 1
    ds, copy = shared_run("zero2@2"), tmp_path / "ds"  # a copy: the shared run stays as it is
    ckpt = copy / "checkpoints" / "step_00000005"
    shutil.copytree(ds / ckpt.relative_to(copy), ckpt)
    shutil.copy(ds / "config.yaml", copy / "config.yaml")
    fsdp = write_config(
        tmp_path / "fsdp.yaml",
        deep_update(shared_extra("fsdp@2"), {"log": {"run_dir": str(tmp_path / "fsdp")}}),
    )
    proc = zerofit(
        "train", "-c", str(fsdp), "--nproc", "2", "--resume", str(ckpt), cwd=tmp_path, timeout=1800
    )
    _quiet(proc)
    assert "converted through the engine-neutral form" in proc.stdout + proc.stderr
    _quiet(
        zerofit(
            "export",
            str(tmp_path / "fsdp"),
            "--out",
            str(tmp_path / "hf"),
            cwd=tmp_path,
            timeout=1800,
        )
    )
    _quiet(
        zerofit(
            "plan", "-c", str(fsdp), "--gpus", "2", "--gpu", "RTX 4090", cwd=tmp_path, timeout=1800
        )
    )


def test_the_noise_pattern_sees_what_it_is_for() -> None:
    samples = [
        "[2026-12-04 19:31:59,907] [WARNING] [real_accelerator.py:213:get_accelerator] Setting ...",
        "DeepSpeed deepspeed.ops.comm.deepspeed_shm_comm_op built successfully",
        "/x/torch/distributed/checkpoint/utils.py:485: UserWarning: torch.distributed is disabled",
        "W1204 19:33:40.172000 14583 torch/utils/_pytree.py:630] <enum 'K'> is an Enum subclass",
        "Failed to load /x/torchao/_C_mxfp8.so: Could not load this library",
    ]
    assert all(NOISE.search(s) for s in samples)
    assert not NOISE.search(io.StringIO("note: resuming from x (step 4)\nweights: none").read())


def test_torchao_syntax_warnings_are_dropped_and_no_others() -> None:
    """Python compiling torchao's sources (no bytecode installed) warns about an escape in one of
    its docstrings; the same warning from any other source still shows."""
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        quiet.install()
        for path in ("/site/torchao/quantization/quant_api", "/site/mylib/quant_api"):
            warnings.warn_explicit(
                "invalid escape sequence '\\.'", SyntaxWarning, f"{path}.py", 1542, module=path
            )
    assert [w.filename for w in seen] == ["/site/mylib/quant_api.py"]
