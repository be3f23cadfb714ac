"""A Hugging Face model folder's weight files: found, checked against the model, read lazily.

Layouts, as transformers writes them (safetensors preferred where both kinds are present):
``model.safetensors``; ``model.safetensors.index.json`` and its shards; ``model-*.safetensors``
without an index; ``pytorch_model.bin``; ``pytorch_model.bin.index.json`` and its shards;
``pytorch_model-*.bin``. ``.bin`` files are opened with ``torch.load(weights_only=True,
mmap=True)`` (no code from the file runs), each once.

``load_hf_weights`` checks the files against the model when the spec is built (in the launcher,
before any worker starts), from safetensors headers and memory-mapped ``.bin`` files, not tensor
data: every parameter needs a tensor of its shape (a tied output head may use the embedding's),
and every tensor needs a parameter (or names a buffer, which is ignored, as transformers does).
Every problem is one ``UserError`` line: no weights, a Git LFS pointer, a truncated or foreign
file, a parameter without a tensor, a tensor without a parameter, a shape that differs.
"""

from __future__ import annotations

import glob
import json
import os
import pickle
import re
import zipfile
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from torch import nn

from zerofit.config.limits import shown
from zerofit.errors import UserError
from zerofit.models.hf import PREFIX
from zerofit.models.hf_head import HFCausalLM
from zerofit.models.llama import strip_wrapper_names
from zerofit.report import quiet

__all__ = ["HFWeights", "WeightFiles", "find_weights", "load_hf_weights", "match_parameters"]

LFS_POINTER = b"version https://git-lfs.github.com/spec/"
MAX_HEADER = 100 * 2**20  # bytes of a safetensors header (safetensors' own limit)
NAMED = 3  # names quoted in one error line
# (format, single file, index, shards without an index), in the order they are looked for.
LAYOUTS = (
    ("safetensors", "model.safetensors", "model.safetensors.index.json", "model-*.safetensors"),
    ("bin", "pytorch_model.bin", "pytorch_model.bin.index.json", "pytorch_model-*.bin"),
)
FORMAT_NAMES = {"safetensors": "safetensors", "bin": "PyTorch .bin"}
# What torch.load raises on a file that is not a PyTorch checkpoint, or a damaged one.
_LOAD_ERRORS = (
    pickle.UnpicklingError, RuntimeError, EOFError, ValueError, OSError, KeyError, AttributeError,
    TypeError, IndexError, ImportError, zipfile.BadZipFile, UnicodeDecodeError,
)  # fmt: skip


def _where(path: str) -> str:
    """``NAME in DIR``, for error lines."""
    folder, name = os.path.split(path)
    return f"{shown(name, quote=False)} in {shown(folder, quote=False)}"


def _refuse_pointer(path: str) -> None:
    """UserError if ``path`` is a Git LFS pointer (the weights were never pulled)."""
    try:
        with open(path, "rb") as f:
            head = f.read(len(LFS_POINTER))
    except OSError as e:
        raise UserError(f"cannot read {_where(path)}: {e.strerror or e}") from None
    if head == LFS_POINTER:
        folder, name = os.path.split(path)
        raise UserError(
            f"{shown(name, quote=False)} is a Git LFS pointer, not the weights: run `git lfs pull` "
            f"in {shown(folder, quote=False)}"
        )


@dataclass
class WeightFiles:
    """The weight files of one folder, with each tensor's file and shape (from headers)."""

    directory: str
    format: str  # "safetensors" or "bin"
    paths: list[str]
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)  # tensor name -> shape
    where: dict[str, str] = field(default_factory=dict)  # tensor name -> file path
    _bins: dict[str, dict[str, torch.Tensor]] = field(default_factory=dict, repr=False)
    _handles: dict[str, Any] = field(default_factory=dict, repr=False)  # safetensors, open

    def read_headers(self) -> None:
        """Fill ``shapes`` and ``where`` (safetensors: headers; .bin: loaded memory-mapped)."""
        for path in self.paths:
            _refuse_pointer(path)
            if self.format == "bin":
                shapes = {k: tuple(t.shape) for k, t in self._bin(path).items()}
            else:
                shapes = _safetensors_shapes(path)
            self.shapes.update(shapes)
            self.where.update(dict.fromkeys(shapes, path))

    def _bin(self, path: str) -> dict[str, torch.Tensor]:
        state = self._bins.get(path)
        if state is None:
            state = self._bins[path] = _load_bin(path)
        return state

    def tensor(self, key: str) -> torch.Tensor:
        """The tensor named ``key`` (on the CPU; a .bin file's is memory-mapped)."""
        path = self.where[key]
        if self.format == "bin":
            return self._bin(path)[key]
        try:
            handle = self._handles.get(path)
            if handle is None:
                handle = self._handles[path] = safe_open(path, framework="pt", device="cpu")
            return handle.get_tensor(key)
        except (SafetensorError, OSError) as e:
            raise UserError(f"cannot read {key} from {_where(path)}: {_first_line(e)}") from None

    def source(self) -> dict[str, Any]:
        """Where the weights come from: format, folder, file names, tensors, bytes on disk."""
        return {
            "format": self.format,
            "directory": self.directory,
            "files": [os.path.basename(p) for p in self.paths],
            "tensors": len(self.shapes),
            "bytes": sum(os.path.getsize(p) for p in self.paths),
        }


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return shown(text.splitlines()[0] if text else type(e).__name__, quote=False)


def _safetensors_shapes(path: str) -> dict[str, tuple[int, ...]]:
    """Tensor name -> shape from a safetensors header, checked against the file's size."""
    size = os.path.getsize(path)

    def bad(why: str) -> UserError:
        return UserError(f"{_where(path)} is truncated or not a safetensors file ({why})")

    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise bad(f"{size} bytes, too few for a header")
        length = int.from_bytes(head, "little")
        if not 0 < length <= min(size - 8, MAX_HEADER):
            raise bad(f"a header of {length} bytes in a file of {size}")
        raw = f.read(length)
    try:
        header = json.loads(raw)
        entries = {k: v for k, v in header.items() if k != "__metadata__"}
        shapes = {k: tuple(int(n) for n in v["shape"]) for k, v in entries.items()}
        end = max((int(v["data_offsets"][1]) for v in entries.values()), default=0)
    except (ValueError, TypeError, KeyError, AttributeError, IndexError):
        raise bad("its header is not a safetensors header") from None
    if 8 + length + end != size:
        raise bad(f"its header describes {8 + length + end} bytes, the file holds {size}")
    return shapes


def _load_bin(path: str) -> dict[str, torch.Tensor]:
    """A .bin state dict, weights only (no code runs) and memory-mapped where the file allows."""
    try:
        with quiet.weights_only_load():
            state = torch.load(
                path, map_location="cpu", weights_only=True, mmap=zipfile.is_zipfile(path)
            )
    except pickle.UnpicklingError as e:
        found = re.search(r"GLOBAL (\S+)", str(e))
        if "weights only" not in str(e).lower() or found is None:
            raise UserError(
                f"{_where(path)} is not a PyTorch checkpoint ({_first_line(e)})"
            ) from None
        raise UserError(
            f"{_where(path)} holds Python objects, not only tensors ({shown(found.group(1))}): "
            "zerofit reads .bin files with weights_only=True and runs no code from them"
        ) from None
    except _LOAD_ERRORS as e:
        raise UserError(
            f"{_where(path)} is truncated or not a PyTorch checkpoint ({_first_line(e)})"
        ) from None
    if not isinstance(state, dict) or not all(
        isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in state.items()
    ):
        raise UserError(f"{_where(path)} is not a state dict (tensor names to tensors)")
    return state


def _indexed(directory: str, index: str) -> list[str]:
    """The shard files an index names, each checked to be there."""
    path = os.path.join(directory, index)
    _refuse_pointer(path)
    try:
        with open(path) as f:
            weight_map = json.load(f)["weight_map"]
        names = sorted(set(weight_map.values()))
        paths = [os.path.join(directory, name) for name in names]
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError):
        raise UserError(
            f"{_where(path)} is not a weight index (a JSON weight_map of tensor names to files)"
        ) from None
    absent = [name for name, p in zip(names, paths, strict=True) if not os.path.isfile(p)]
    if absent:
        raise UserError(
            f"{_where(path)} names {shown(absent[0])}, which is not there ({len(absent)} of "
            f"{len(names)} files missing)"
        )
    return paths


def find_weights(directory: str) -> WeightFiles | None:
    """The folder's weight files with their tensors' names and shapes; None when it has none."""
    for fmt, single, index, shards in LAYOUTS:
        if os.path.isfile(os.path.join(directory, single)):
            paths = [os.path.join(directory, single)]
        elif os.path.isfile(os.path.join(directory, index)):
            paths = _indexed(directory, index)
        else:
            paths = sorted(glob.glob(os.path.join(glob.escape(directory), shards)))
        if paths:
            files = WeightFiles(directory, fmt, paths)
            files.read_headers()
            return files
    return None


def no_weights_line(directory: str) -> str:
    """Why a folder without weight files is refused, and what to do."""
    where = shown(directory, quote=False)
    line = f"{where} holds no weights (model.safetensors, model-*.safetensors, pytorch_model*.bin)"
    if os.path.isfile(os.path.join(directory, "adapter_config.json")):
        return f"{line}: it is a PEFT adapter; give model.hf the base model's folder"
    others = [f for f in sorted(os.listdir(directory)) if f.endswith(_OTHER_WEIGHTS)]
    if others:
        line += f" (it has {shown(', '.join(others[:NAMED]), quote=False)}: not read)"
    return (
        f"{line}: put the model's weight files there, or set model.random_init=true to train from "
        "random weights"
    )


_OTHER_WEIGHTS = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".ckpt")


def _key(name: str, shapes: Mapping[str, Any], prefixes: tuple[str, ...]) -> str | None:
    """The tensor for parameter ``name``: itself, or with a base-model prefix dropped or added
    (checkpoints of a bare base model lack it)."""
    if name in shapes:
        return name
    for p in prefixes:
        other = name[len(p) :] if name.startswith(p) else p + name
        if other in shapes:
            return other
    return None


def _names(items: list[str]) -> str:
    more = f" and {len(items) - NAMED} more" if len(items) > NAMED else ""
    return shown(", ".join(items[:NAMED]), quote=False) + more


def _ignored(model: nn.Module, prefixes: tuple[str, ...]) -> Callable[[str], bool]:
    """Whether a tensor name is one to ignore: a buffer (e.g. an older layout's per-layer
    ``rotary_emb.inv_freq``), or a name the model class says to ignore."""
    buffers = {n for n, _ in model.named_buffers(remove_duplicate=False)}
    tails = {".".join(n.split(".")[-2:]) for n in buffers}
    patterns = list(getattr(model, "_keys_to_ignore_on_load_unexpected", None) or ())

    def ignored(key: str) -> bool:
        if _key(key, dict.fromkeys(buffers), prefixes) or ".".join(key.split(".")[-2:]) in tails:
            return True
        return any(re.search(p, key) for p in patterns)

    return ignored


def match_parameters(files: WeightFiles, model: nn.Module, overridden: bool = False) -> dict:
    """Every parameter name of ``model`` (an HF model; tied names too) -> its tensor's name.

    UserError for a parameter without a tensor (a tied head may share the embedding's), a tensor
    no parameter takes (buffers aside), or a shape that differs. ``overridden``: model.overrides
    changed config.json (named in the line, as the likely cause)."""
    prefixes = tuple(dict.fromkeys(["model.", f"{getattr(model, 'base_model_prefix', '')}."]))
    prefixes = tuple(p for p in prefixes if p != ".")
    groups: dict[int, list[tuple[str, nn.Parameter]]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        groups.setdefault(id(p), []).append((name, p))
    keys: dict[str, str] = {}
    used: set[str] = set()
    missing: list[str] = []
    wrong: list[tuple[str, tuple[int, ...], tuple[int, ...], str]] = []
    for group in groups.values():
        found = [k for n, _ in group if (k := _key(n, files.shapes, prefixes))]
        name, param = group[0]
        if not found:
            missing.append(name)
            continue
        used.update(found)
        keys.update(dict.fromkeys((n for n, _ in group), found[0]))
        if files.shapes[found[0]] != tuple(param.shape):
            wrong.append((found[0], files.shapes[found[0]], tuple(param.shape), name))
    ignored = _ignored(model, prefixes)
    extra = [k for k in files.shapes if k not in used and not ignored(k)]
    where = f"the {FORMAT_NAMES[files.format]} weights in {shown(files.directory, quote=False)}"
    cause = " (model.overrides changes config.json)" if overridden else ""
    if missing:
        raise UserError(
            f"{where} lack {len(missing)} of the model's {len(groups)} parameters: "
            f"{_names(missing)}; they do not fit its config.json{cause}"
        )
    if extra:
        raise UserError(
            f"{where} hold {len(extra)} tensors no parameter of the model takes: {_names(extra)}; "
            f"they do not fit its config.json{cause}"
        )
    if wrong:
        key, theirs, ours, name = wrong[0]
        others = f" ({len(wrong) - 1} more differ)" if len(wrong) > 1 else ""
        raise UserError(
            f"{where}: {shown(key, quote=False)} has shape {list(theirs)}, the model's {name} "
            f"{list(ours)}{others}; they do not fit its config.json{cause}"
        )
    return keys


class HFWeights(Mapping[str, torch.Tensor]):
    """Lazy ``adapter param name -> full tensor`` over checked weight files; also callable.

    ``keys`` (from ``match_parameters``) maps each HF parameter name to its tensor's; the names
    asked for may carry wrapper segments and the adapter prefix (``hf.``)."""

    def __init__(self, files: WeightFiles, keys: dict[str, str], prefix: str = PREFIX) -> None:
        self.files = files
        self._keys = keys
        self._prefix = prefix

    def _resolve(self, name: str) -> str:
        key = strip_wrapper_names(name)
        if self._prefix and key.startswith(self._prefix):
            key = key[len(self._prefix) :]
        try:
            return self._keys[key]
        except KeyError:
            raise KeyError(name) from None

    def __getitem__(self, name: str) -> torch.Tensor:
        return self.files.tensor(self._resolve(name))

    def __call__(self, name: str) -> torch.Tensor:
        return self[name]

    def __contains__(self, name: object) -> bool:
        try:
            self._resolve(str(name))
        except KeyError:
            return False
        return True

    def __iter__(self) -> Iterator[str]:
        return (self._prefix + k for k in self._keys)

    def __len__(self) -> int:
        return len(self._keys)

    def source(self) -> dict[str, Any]:
        """``WeightFiles.source``: where the weights come from."""
        return self.files.source()


def load_hf_weights(directory: str, adapter: HFCausalLM, overridden: bool = False) -> HFWeights:
    """The weights of the folder, checked against ``adapter``'s HF model (names and shapes);
    UserError (one line) when the folder has none or they do not fit."""
    files = find_weights(directory)
    if files is None:
        raise UserError(no_weights_line(directory))
    return HFWeights(files, match_parameters(files, adapter.hf, overridden))
