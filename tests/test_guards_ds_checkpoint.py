"""DeepSpeed checkpoint files: the records `ds_safe_globals` allows load, nothing beside them does.

`load_ds_file` is `load_torch_file` (``torch.load(weights_only=True)``) with DeepSpeed's plain-data
records allowed: its loss scalers, the ZeRO stage enum and fragment addresses. Each allowed record
loads; a class or callable from the same DeepSpeed modules that is not on the list is refused
before it runs, and so is a payload. (Importing DeepSpeed takes a few seconds: its own file.)
"""

from __future__ import annotations

import importlib
import io
import os
import zipfile
from pathlib import Path

import pytest
import torch

from zerofit.backends.deepspeed import checkpoint as ds_checkpoint
from zerofit.backends.deepspeed.checkpoint import ds_safe_globals, load_ds_file
from zerofit.checkpoint.safe_load import UnsafeCheckpointError

pytest.importorskip("deepspeed")
MODULES = {
    "deepspeed.runtime.fp16.loss_scaler": ("LossScaler", "DynamicLossScaler"),
    "deepspeed.runtime.zero.config": ("ZeroStageEnum",),
    "deepspeed.utils.tensor_fragment": ("fragment_address",),
}


def mod(name: str):  # noqa: ANN201
    return importlib.import_module(name)


def save(obj: object, path: Path) -> Path:
    buf = io.BytesIO()
    torch.save(obj, buf)
    path.write_bytes(buf.getvalue())
    return path


def with_pickle(path: Path, raw: bytes) -> Path:
    """``path`` (a torch.save zip) with its data.pkl replaced by ``raw``."""
    with zipfile.ZipFile(path) as z:
        members = {n: z.read(n) for n in z.namelist()}
    pkl = next(n for n in members if n.endswith("data.pkl"))
    members[pkl] = raw
    with zipfile.ZipFile(path, "w") as z:
        for n, data in members.items():
            z.writestr(n, data)
    return path


def call_pickle(module: str, name: str, *args: str) -> bytes:
    body = b"".join(b"X" + len(a.encode()).to_bytes(4, "little") + a.encode() for a in args)
    return b"\x80\x04c" + f"{module}\n{name}\n".encode() + b"(" + body + b"tR."


def test_the_allowed_records_are_exactly_deepspeeds_plain_data_classes() -> None:
    want = [getattr(mod(m), n) for m, names in MODULES.items() for n in names]
    assert ds_safe_globals() == want


def test_each_allowed_record_loads(tmp_path: Path) -> None:
    ls = mod("deepspeed.runtime.fp16.loss_scaler")
    stage = mod("deepspeed.runtime.zero.config").ZeroStageEnum.weights
    address = mod("deepspeed.utils.tensor_fragment").fragment_address(numel=12, start=4)
    dynamic = ls.DynamicLossScaler(2.0**16, 1000, 1.0, 2, False)
    state = {
        "loss_scaler": ls.LossScaler(scale=128.0),
        "dynamic": dynamic,
        "zero_stage": stage,
        "param_slice_mappings": [{"w": address}],
        "flat": torch.arange(3.0),
    }
    got = load_ds_file(save(state, tmp_path / "optim_states.pt"))
    assert got["loss_scaler"].cur_scale == 128.0
    assert got["dynamic"].cur_scale == 2.0**16 and got["dynamic"].scale_window == 1000
    assert got["zero_stage"] is stage
    assert got["param_slice_mappings"][0]["w"] == address
    assert torch.equal(got["flat"], torch.arange(3.0))


@pytest.mark.parametrize(
    ("module", "name"),
    [
        ("deepspeed.runtime.fp16.loss_scaler", "LossScalerBase"),
        ("deepspeed.runtime.fp16.loss_scaler", "LossScaleConfig"),
        ("deepspeed.runtime.zero.config", "DeepSpeedZeroConfig"),
        ("deepspeed.utils.tensor_fragment", "tensor_fragment"),
    ],
)
def test_a_deepspeed_class_beside_the_allowed_ones_is_refused(
    tmp_path: Path, module: str, name: str
) -> None:
    path = save({"x": torch.ones(1)}, tmp_path / "f.pt")
    raw = b"\x80\x02c" + f"{module}\n{name}\n".encode() + b")\x81."  # cls.__new__(cls)
    with_pickle(path, raw)
    with pytest.raises(UnsafeCheckpointError, match=f"^{path} refused: "):
        load_ds_file(path)


@pytest.mark.parametrize(
    ("module", "name"),
    [
        ("deepspeed.runtime.fp16.loss_scaler", "torch.save"),
        ("deepspeed.utils.tensor_fragment", "torch.save"),
        ("torch", "save"),
        ("posix", "system"),
    ],
)
def test_a_callable_next_to_the_records_never_runs(tmp_path: Path, module: str, name: str) -> None:
    marker = tmp_path / "PWNED"
    path = save({"x": torch.ones(1)}, tmp_path / "f.pt")
    args = (f"touch {marker}",) if name == "system" else ("payload", str(marker))
    with_pickle(path, call_pickle(module, name, *args))
    with pytest.raises(UnsafeCheckpointError, match=f"^{path} refused: "):
        load_ds_file(path)
    assert not marker.exists()


def test_a_payload_in_a_deepspeed_file_never_runs(tmp_path: Path) -> None:
    marker = tmp_path / "PWNED"

    class Payload:
        def __reduce__(self):  # noqa: ANN204
            return (os.system, (f"touch {marker}",))

    path = save({"optimizer_state_dict": Payload()}, tmp_path / "f.pt")
    with pytest.raises(UnsafeCheckpointError, match=f"^{path} refused: "):
        load_ds_file(path)
    assert not marker.exists()


def test_a_missing_deepspeed_module_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.import_module

    def fake(name: str, *a: object, **kw: object) -> object:
        if name == "deepspeed.runtime.zero.config":
            raise ImportError(name)
        return real(name, *a, **kw)

    monkeypatch.setattr(ds_checkpoint.importlib, "import_module", fake)
    got = ds_safe_globals()
    names = [g.__name__ for g in got]
    assert names == ["LossScaler", "DynamicLossScaler", "fragment_address"]


def test_a_record_deepspeed_no_longer_has_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    ls = mod("deepspeed.runtime.fp16.loss_scaler")
    monkeypatch.delattr(ls, "DynamicLossScaler")
    names = [g.__name__ for g in ds_safe_globals()]
    assert names == ["LossScaler", "ZeroStageEnum", "fragment_address"]
