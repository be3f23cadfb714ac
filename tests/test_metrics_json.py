"""metrics.jsonl is strict JSON: non-finite values are written as null and named."""

from __future__ import annotations

import json
from pathlib import Path

from zerofit.report.metrics import MetricsSink, truncate_metrics


def test_nonfinite_values_are_null_and_named(tmp_path: Path) -> None:
    sink = MetricsSink(tmp_path, jsonl=True, tensorboard=False, enabled=True)
    sink.write({"step": 1, "loss": float("nan"), "grad_norm": float("inf"), "lr": 1e-3})
    sink.write({"step": 2, "loss": 2.5})
    sink.close()
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    first = json.loads(lines[0], parse_constant=lambda c: (_ for _ in ()).throw(ValueError(c)))
    assert first == {
        "step": 1,
        "loss": None,
        "grad_norm": None,
        "lr": 1e-3,
        "nonfinite": ["loss", "grad_norm"],
    }
    assert json.loads(lines[1]) == {"step": 2, "loss": 2.5}


def test_resume_keeps_one_record_per_step(tmp_path: Path) -> None:
    records = [{"step": s, "loss": 1.0} for s in (1, 2, 3, 4)]
    text = "".join(json.dumps(r) + "\n" for r in records) + '{"step": 5, "lo'  # torn last line
    (tmp_path / "metrics.jsonl").write_text(text)
    assert truncate_metrics(tmp_path, 2) == 3
    kept = [
        json.loads(line)["step"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()
    ]
    assert kept == [1, 2]
    assert len((tmp_path / "metrics.abandoned.jsonl").read_text().splitlines()) == 3
