"""Tokenizers: bytes, a bare ``tokenizer.json`` (the ``tokenizers`` library), or a tokenizer
folder (transformers' ``AutoTokenizer``, offline, with the folder's chat template).

Every tokenizer has ``vocab_size``; ``eos_id``, the document separator of the text format (found
by name among ``EOS_CANDIDATES``, as zerofit always did); and ``end_id``, the token that ends a
completion in fine-tuning samples (the folder's own ``eos_token`` when it declares one).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import tokenizers

from zerofit.config.limits import shown
from zerofit.errors import UserError

EOS_CANDIDATES = ("<|end_of_text|>", "<|endoftext|>", "</s>", "<eos>")


class Tokenizer(Protocol):
    vocab_size: int
    eos_id: int | None
    end_id: int | None

    def encode(self, text: str) -> np.ndarray: ...
    def encode_batch(self, texts: list[str]) -> list[np.ndarray]: ...
    def decode(self, ids: Iterable[int]) -> str: ...


class ByteTokenizer:
    """Ids 0..255 are the UTF-8 bytes of the text; 256 is EOS."""

    vocab_size = 257
    eos_id: int | None = 256
    end_id: int | None = 256
    chat_template: str | None = None

    def encode(self, text: str) -> np.ndarray:
        data = text.encode("utf-8", errors="surrogatepass")
        return np.frombuffer(data, dtype=np.uint8).astype(np.int32)

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        return [self.encode(t) for t in texts]

    def decode(self, ids: Iterable[int]) -> str:
        return bytes(int(i) for i in ids if 0 <= int(i) < 256).decode("utf-8", errors="replace")


def _find_eos(token_to_id: Any) -> int | None:
    for name in EOS_CANDIDATES:
        tid = token_to_id(name)
        if tid is not None:
            return int(tid)
    return None


class HFTokenizer:
    """A local ``tokenizer.json`` loaded with the ``tokenizers`` library."""

    chat_template: str | None = None

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = str(path)
        try:
            self._tok = tokenizers.Tokenizer.from_file(self.path)
        except Exception as e:  # the library raises plain Exceptions for bad files
            raise UserError(
                f"cannot load tokenizer {shown(self.path, quote=False)}: {shown(e, quote=False)}"
            ) from None
        self.vocab_size: int = self._tok.get_vocab_size(with_added_tokens=True)
        self.eos_id: int | None = _find_eos(self._tok.token_to_id)
        self.end_id: int | None = self.eos_id

    def encode(self, text: str) -> np.ndarray:
        return np.asarray(self._tok.encode(text, add_special_tokens=False).ids, dtype=np.int32)

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        encs = self._tok.encode_batch(texts, add_special_tokens=False)
        return [np.asarray(e.ids, dtype=np.int32) for e in encs]

    def decode(self, ids: Iterable[int]) -> str:
        return self._tok.decode([int(i) for i in ids])


class FolderTokenizer:
    """A tokenizer folder loaded with transformers' ``AutoTokenizer`` (offline), as the model's
    users load it: the same ids, special tokens and chat template (``self.hf``)."""

    def __init__(self, folder: Path) -> None:
        try:
            from transformers import AutoTokenizer  # optional: transformers (the hf extra)
        except ImportError:
            raise UserError(
                f"tokenizer folder {shown(folder, quote=False)} needs the transformers package "
                "(pip install 'zerofit[hf]'), or give its tokenizer.json"
            ) from None
        try:
            self.hf = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
        except Exception as e:  # OSError, ValueError, JSON errors... from many loaders
            raise UserError(
                f"cannot load tokenizer folder {shown(folder, quote=False)}: {shown(e, quote=False)}"
            ) from None
        self.path = str(folder)
        self.vocab_size: int = len(self.hf)
        vocab = self.hf.get_vocab()
        self.eos_id: int | None = _find_eos(vocab.get)
        own_eos = self.hf.eos_token_id
        self.end_id: int | None = int(own_eos) if own_eos is not None else self.eos_id
        self.chat_template: str | None = getattr(self.hf, "chat_template", None) or None

    def encode(self, text: str) -> np.ndarray:
        ids = self.hf(text, add_special_tokens=False)["input_ids"]
        return np.asarray(ids, dtype=np.int32)

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        if not texts:
            return []
        out = self.hf(texts, add_special_tokens=False)["input_ids"]
        return [np.asarray(ids, dtype=np.int32) for ids in out]

    def decode(self, ids: Iterable[int]) -> str:
        return self.hf.decode([int(i) for i in ids])


AnyTokenizer = ByteTokenizer | HFTokenizer | FolderTokenizer


def load_tokenizer(spec: str) -> AnyTokenizer:
    """``"byte"``, a path to a ``tokenizer.json``, or a tokenizer folder (``AutoTokenizer``)."""
    if spec == "byte":
        return ByteTokenizer()
    path = Path(spec).expanduser()
    if path.is_dir():
        if not any(path.glob("tokenizer*")) and not (path / "vocab.json").is_file():
            raise UserError(
                f"tokenizer file not found: {shown(path / 'tokenizer.json', quote=False)} "
                "(use 'byte', a tokenizer.json path or a tokenizer folder)"
            )
        return FolderTokenizer(path)
    if not path.is_file():
        raise UserError(
            f"tokenizer file not found: {shown(path, quote=False)} (use 'byte' or a tokenizer.json path)"
        )
    return HFTokenizer(path)
