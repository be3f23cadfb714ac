"""`zerofit config schema|show`: the config's JSON Schema for editors, and a loaded config."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import yaml
from pydantic import TypeAdapter
from pydantic.json_schema import GenerateJsonSchema

from zerofit import __version__
from zerofit.backends.catalog import RunConfig
from zerofit.config import to_dict
from zerofit.errors import UserError
from zerofit.launch.run_config import load_config


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
    p.add_argument("-o", "--out", help="schema: write to this file instead of stdout")
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


def run(args: argparse.Namespace, overrides: list[str]) -> int:
    if args.action == "schema":
        if overrides or args.config:
            raise UserError("config schema takes no config; it describes every config")
        text = json.dumps(json_schema(), indent=1) + "\n"
        if args.out:
            Path(args.out).write_text(text)
            print(f"wrote {args.out}")
        else:
            sys.stdout.write(text)
        return 0
    cfg = load_config(args.config, overrides)
    sys.stdout.write(yaml.safe_dump(to_dict(cfg), sort_keys=False))
    return 0
