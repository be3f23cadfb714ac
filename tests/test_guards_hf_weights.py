"""``pytorch_model.bin`` files are read with ``torch.load(weights_only=True)``: tensors only.

Next to what that allows (tensors, their dtypes, containers) each test plants what it refuses: a
torch callable (``torch.save``, ``torch.serialization.save``), ``builtins.eval``, a pickled class
whose reduce would run ``os.system``. Each is refused with the file named, before it runs; a real
state dict (zip or legacy format) still loads, and a file of tensors that is no state dict is
named as such.
"""

from __future__ import annotations

import io
import os
import zipfile
from pathlib import Path

import pytest
import torch

from zerofit.errors import UserError
from zerofit.models.hf_weights import find_weights


def save(obj: object, path: Path, zipped: bool = True) -> Path:
    buf = io.BytesIO()
    torch.save(obj, buf, _use_new_zipfile_serialization=zipped)
    path.write_bytes(buf.getvalue())
    return path


def call_pickle(module: str, name: str, *args: str) -> bytes:
    body = b"".join(b"X" + len(a.encode()).to_bytes(4, "little") + a.encode() for a in args)
    return b"\x80\x04c" + f"{module}\n{name}\n".encode() + b"(" + body + b"tR."


def planted(tmp_path: Path, raw: bytes) -> Path:
    path = save({"w": torch.ones(1)}, tmp_path / "pytorch_model.bin")
    with zipfile.ZipFile(path) as z:
        members = {n: z.read(n) for n in z.namelist()}
    pkl = next(n for n in members if n.endswith("data.pkl"))
    members[pkl] = raw
    with zipfile.ZipFile(path, "w") as z:
        for n, data in members.items():
            z.writestr(n, data)
    return path


def refused(folder: Path) -> str:
    with pytest.raises(UserError) as err:
        find_weights(str(folder))
    return str(err.value)


@pytest.mark.parametrize("zipped", [True, False], ids=["zip", "legacy"])
def test_a_state_dict_of_tensors_loads(tmp_path: Path, zipped: bool) -> None:
    want = {
        "model.w": torch.arange(6.0).reshape(2, 3),
        "model.b": torch.ones(3, dtype=torch.bfloat16),
    }
    save(want, tmp_path / "pytorch_model.bin", zipped)
    files = find_weights(str(tmp_path))
    assert files is not None and files.format == "bin"
    assert files.shapes == {"model.w": (2, 3), "model.b": (3,)}
    assert torch.equal(files.tensor("model.w"), want["model.w"])
    assert files.tensor("model.b").dtype == torch.bfloat16


@pytest.mark.parametrize(
    ("module", "name", "args"),
    [
        ("torch", "save", ("payload", "MARKER")),
        ("torch.serialization", "save", ("payload", "MARKER")),
        ("torch", "from_file", ("MARKER",)),
        ("builtins", "eval", ("open('MARKER', 'w').close()",)),
        ("posix", "system", ("touch MARKER",)),
        ("pathlib", "os.system", ("touch MARKER",)),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_a_callable_in_a_bin_file_is_refused_before_it_runs(
    tmp_path: Path, module: str, name: str, args: tuple[str, ...]
) -> None:
    marker = tmp_path / "PWNED"
    planted(tmp_path, call_pickle(module, name, *(a.replace("MARKER", str(marker)) for a in args)))
    line = refused(tmp_path)
    assert line.startswith(f"pytorch_model.bin in {tmp_path} holds Python objects"), line
    assert name.rsplit(".", 1)[-1] in line and "weights_only=True" in line, line  # names it
    assert not marker.exists()


def test_a_pickled_object_in_a_bin_file_is_refused_before_it_runs(tmp_path: Path) -> None:
    marker = tmp_path / "PWNED"

    class Payload:
        def __reduce__(self):  # noqa: ANN204
            return (os.system, (f"touch {marker}",))

    save({"model.w": torch.ones(1), "x": Payload()}, tmp_path / "pytorch_model.bin")
    assert "holds Python objects, not only tensors" in refused(tmp_path)
    assert not marker.exists()


@pytest.mark.parametrize(
    "obj",
    [
        [torch.ones(1)],
        {"w": torch.ones(1), "dtype": torch.float32},  # allowed by weights_only, no tensor
        {"w": torch.ones(1), "step": 3},
        {1: torch.ones(1)},
        torch.ones(2),
    ],
    ids=["list", "dtype", "int", "int-key", "tensor"],
)
def test_tensors_that_are_no_state_dict_are_named(tmp_path: Path, obj: object) -> None:
    save(obj, tmp_path / "pytorch_model.bin")
    line = refused(tmp_path)
    assert line == f"pytorch_model.bin in {tmp_path} is not a state dict (tensor names to tensors)"


def test_a_pickle_that_is_not_a_checkpoint_is_named(tmp_path: Path) -> None:
    (tmp_path / "pytorch_model.bin").write_bytes(b"\x80\x04K\x05.")  # the int 5, no zip
    line = refused(tmp_path)
    assert line.startswith(f"pytorch_model.bin in {tmp_path} "), line
    assert "holds Python objects" not in line
