"""Where documents and records come from: ``"stdlib"``, .txt files (one document each), and
record files (.jsonl, .json holding a list of records, .parquet), or directories of these.

Records come with where they were read (``file:line`` for JSON Lines, ``file: record N`` for
.json, ``file: row N`` for Parquet), so a bad one is named in its error line.
"""

from __future__ import annotations

import json
import os
import sysconfig
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from zerofit.config.limits import shown
from zerofit.errors import UserError

_SKIP_DIRS = frozenset(
    {"site-packages", "dist-packages", "test", "tests", "idlelib", "__pycache__"}
)
RECORD_SUFFIXES = (".jsonl", ".json", ".parquet")
Record = tuple[dict[str, Any], str]  # a record and where it was read


def stdlib_files() -> list[Path]:
    """The interpreter's own standard-library ``.py`` files, in a deterministic order."""
    root = sysconfig.get_paths()["stdlib"]
    out: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS)
        out.extend(Path(dirpath, f) for f in sorted(filenames) if f.endswith(".py"))
    return out


def _iter_jsonl(path: Path) -> Iterator[Record]:
    with path.open("r", encoding="utf-8", errors="replace") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise UserError(f"{path}:{lineno}: invalid JSON ({e.msg})") from None
            if not isinstance(obj, dict):
                raise UserError(
                    f"{path}:{lineno}: a JSON line must be an object, not {type(obj).__name__}"
                )
            yield obj, f"{path}:{lineno}"


def _iter_json(path: Path) -> Iterator[Record]:
    try:
        data = json.loads(path.read_text(encoding="utf-8", errors="replace"))
    except json.JSONDecodeError as e:
        raise UserError(f"{path}:{e.lineno}: invalid JSON ({e.msg})") from None
    if not isinstance(data, list):
        raise UserError(
            f"{path}: a .json source must hold a list of records, not {type(data).__name__}"
        )
    for i, obj in enumerate(data, 1):
        if not isinstance(obj, dict):
            raise UserError(f"{path}: record {i} is not an object")
        yield obj, f"{path}: record {i}"


def _iter_parquet(path: Path) -> Iterator[Record]:
    try:
        import pyarrow.parquet as pq  # optional here: only .parquet sources need pyarrow
    except ImportError:
        raise UserError(
            f"{path}: reading .parquet needs the pyarrow package (pip install pyarrow)"
        ) from None
    try:
        reader = pq.ParquetFile(str(path))
        row = 0
        for batch in reader.iter_batches(batch_size=1024):
            for obj in batch.to_pylist():
                row += 1
                yield obj, f"{path}: row {row}"
    except (OSError, ValueError) as e:  # pyarrow's ArrowInvalid is a ValueError
        raise UserError(f"{path}: cannot read Parquet ({shown(e, quote=False)})") from None


def iter_records(path: Path) -> Iterator[Record]:
    """The records of one .jsonl, .json or .parquet file."""
    if path.suffix == ".jsonl":
        return _iter_jsonl(path)
    if path.suffix == ".json":
        return _iter_json(path)
    if path.suffix == ".parquet":
        return _iter_parquet(path)
    raise UserError(f"{path}: not a record file (expected {', '.join(RECORD_SUFFIXES)})")


def _files(path: Path, suffixes: tuple[str, ...]) -> list[Path]:
    """A file itself, or a directory's files with these suffixes, sorted."""
    if not path.is_dir():
        return [path]
    files = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in suffixes)
    if not files:
        raise UserError(f"no {'/'.join(suffixes)} files in directory {path}")
    return files


def _check_sources(source: str | list[str]) -> list[str]:
    sources = [source] if isinstance(source, str) else list(source)
    if not sources:
        raise UserError("data source list is empty")
    for s in sources:
        if s != "stdlib" and not Path(s).expanduser().exists():
            raise UserError(f"data source not found: {shown(s, quote=False)}")
    return sources


def field_text(obj: dict[str, Any], field: str, where: str) -> str:
    if field not in obj:
        raise UserError(f"{where}: no field {field!r} in this record")
    value = obj[field]
    if not isinstance(value, str):
        raise UserError(f"{where}: field {field!r} is not a string")
    return value


def _file_documents(path: Path, field: str) -> Iterator[str]:
    for f in _files(path, (".txt", *RECORD_SUFFIXES)):
        if f.suffix in RECORD_SUFFIXES:
            for obj, where in iter_records(f):
                yield field_text(obj, field, where)
        else:  # .txt or anything else named directly: the whole file is one document
            yield f.read_text(encoding="utf-8", errors="replace")


def iter_documents(source: str | list[str], field: str = "text") -> Iterator[str]:
    """Documents from ``"stdlib"``, .txt/.jsonl/.json/.parquet files, directories, or a list of
    these. Empty documents are skipped. Paths are checked up front so a typo fails fast."""
    for s in _check_sources(source):
        if s == "stdlib":
            docs: Iterator[str] = (
                p.read_text(encoding="utf-8", errors="replace") for p in stdlib_files()
            )
        else:
            docs = _file_documents(Path(s).expanduser(), field)
        for doc in docs:
            if doc:
                yield doc


def iter_sample_records(source: str | list[str]) -> Iterator[Record]:
    """Fine-tuning records from .jsonl/.json/.parquet files or directories of them."""
    for s in _check_sources(source):
        if s == "stdlib":
            raise UserError("data.source 'stdlib' holds plain text: use data.format=text")
        for f in _files(Path(s).expanduser(), RECORD_SUFFIXES):
            yield from iter_records(f)
