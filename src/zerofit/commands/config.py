"""`zerofit config schema|show`: the config's JSON Schema for editors, and a loaded config."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, TextIO

import yaml
from pydantic import TypeAdapter
from pydantic.json_schema import GenerateJsonSchema

from zerofit import __version__
from zerofit.backends.catalog import RunConfig
from zerofit.config import to_dict
from zerofit.errors import UserError
from zerofit.launch.run_config import load_config
from zerofit.report.quiet import data_output


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "config",
        help="the config's JSON Schema (for editors), or a config as zerofit reads it",
        description="`schema` writes a JSON Schema of zerofit's YAML config: point your editor "
        "at it (e.g. a `# yaml-language-server: $schema=zerofit.schema.json` first line) to get "
        "completion and checks. `show` prints a config with every default filled in.",
    )
    p.add_argument("action", choices=["schema", "show"])
    p.add_argument("-c", "--config", help="show: a YAML config (default: the embedded defaults)")
    p.add_argument("-o", "--out", help="write to this file instead of stdout")
    p.set_defaults(run=run, takes_overrides=True)


def json_schema() -> dict[str, Any]:
    """Draft 2020-12 JSON Schema of a run's config (`zerofit.backends.catalog.RunConfig`) (unknown keys are errors)."""

    class _Schema(GenerateJsonSchema):
        # bounds sit behind zerofit's own int coercion, where pydantic keeps its names for them
        def generate(self, schema: Any, mode: Any = "validation") -> Any:
            return _standard_bounds(super().generate(schema, mode))

    out = TypeAdapter(RunConfig).json_schema(schema_generator=_Schema)
    out["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    out["title"] = f"zerofit {__version__} config"
    return out


def _standard_bounds(node: Any) -> Any:
    names = {"ge": "minimum", "le": "maximum", "gt": "exclusiveMinimum", "lt": "exclusiveMaximum"}
    if isinstance(node, dict):
        typed = node.get("type") in ("integer", "number")
        return {
            (names[k] if typed and k in names else k): _standard_bounds(v) for k, v in node.items()
        }
    if isinstance(node, list):
        return [_standard_bounds(v) for v in node]
    return node


def _emit(text: str, out: str | None, stdout: TextIO) -> None:
    """`text` to the file `out` (written whole, then renamed into place), else to `stdout`."""
    if not out:
        stdout.write(text)
        return
    path = Path(out)
    if path.is_dir():
        raise UserError(f"--out {out} is a folder: give a file name")
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_text(text)
        tmp.replace(path)
    except OSError as e:
        raise UserError(f"cannot write {out}: {e.strerror or e}") from None
    print(f"wrote {out}", file=sys.stderr)


def run(args: argparse.Namespace, overrides: list[str]) -> int:
    with data_output() as stdout:
        if args.action == "schema":
            if overrides or args.config:
                raise UserError("config schema takes no config; it describes every config")
            text = json.dumps(json_schema(), indent=1) + "\n"
        else:
            text = yaml.safe_dump(to_dict(load_config(args.config, overrides)), sort_keys=False)
        _emit(text, args.out, stdout)
    return 0
