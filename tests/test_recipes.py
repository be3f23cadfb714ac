"""Every shipped recipe parses, validates and names a model that fits its sequence length."""

from __future__ import annotations

from pathlib import Path

import pytest

from zerofit.config import load_config
from zerofit.models import build_model

RECIPES = sorted((Path(__file__).resolve().parents[1] / "configs").rglob("*.yaml"))


def test_there_are_recipes() -> None:
    assert len(RECIPES) >= 3


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.name)
def test_recipe_loads(path: Path) -> None:
    cfg = load_config(path)
    spec = build_model(cfg.model.preset, cfg.model.hf, cfg.model.overrides)
    assert cfg.model.seq_len <= spec.max_seq_len
