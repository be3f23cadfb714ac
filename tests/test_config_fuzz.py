"""Config fuzzing: hostile mutants of configs/tiny-cpu.yaml through `zerofit train`, in process.

Each mutant runs `zerofit.cli.main(["train", "-c", FILE, "--nproc", "1", *flags])` with the
worker launch stubbed out, so it takes the same path as a real run up to the point where workers
would start (config loading, validation, model and data preparation, run directory checks). It
must either be accepted (exit 0) or refused with exactly one `error:` line and exit 2, within
1 s, never a traceback. Two seeds per run: a fixed one, and one that changes with every run
(printed; set ZEROFIT_FUZZ_SEED to replay it).
"""

from __future__ import annotations

import contextlib
import io
import os
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

import pytest
from config_mutants import CORPUS, MUTATORS, Mutant, base_text, mutants

import zerofit.cli
import zerofit.commands.train
import zerofit.launch.spawn

FIXED_SEED = 20_240_611
PER_SEED = 400  # x 2 seeds
MAX_LINE = 450  # characters in the error line: quoted values are cut at ~200 each
REFUSE_WITHIN_S = 1.0
ACCEPT_WITHIN_S = 5.0  # accepted mutants also build the (meta) model and pack the data
INFO_PREFIXES: tuple[str, ...] = ()  # no line may come before the error


@dataclass
class Outcome:
    code: int | None
    err: str
    seconds: float
    crash: str | None = None  # a traceback that escaped main()


def rotating_seed() -> int:
    env = os.environ.get("ZEROFIT_FUZZ_SEED")
    return int(env) if env else time.time_ns() % 2**32


def run_mutant(m: Mutant, path: Path) -> Outcome:
    path.write_bytes(m.data)
    err = io.StringIO()
    start = time.perf_counter()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            code = zerofit.cli.main(["train", "-c", str(path), "--nproc", "1", *m.args])
    except BaseException:  # noqa: BLE001  (SystemExit, KeyboardInterrupt: also failures here)
        return Outcome(None, err.getvalue(), time.perf_counter() - start, traceback.format_exc())
    return Outcome(code, err.getvalue(), time.perf_counter() - start)


def problem(o: Outcome) -> str | None:
    """What is wrong with an outcome, or None when it is an acceptance or a clean refusal."""
    if o.crash:
        return "an exception escaped main():\n" + o.crash[-3000:]
    if "Traceback" in o.err:
        return "a traceback on stderr:\n" + o.err[-3000:]
    if o.code == 0:
        return None if o.seconds < ACCEPT_WITHIN_S else f"accepted after {o.seconds:.2f} s"
    if o.code != 2:
        return f"exit code {o.code}, stderr: {o.err[-1000:]!r}"
    lines = [line for line in o.err.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("error: ")]
    if len(errors) != 1 or lines[-1] != errors[0]:
        return f"not one error line last on stderr: {o.err[-1000:]!r}"
    if any(not line.startswith(INFO_PREFIXES) for line in lines[:-1]):
        return f"other output on stderr: {o.err[-1000:]!r}"
    if len(errors[0]) > MAX_LINE:
        return f"an error line of {len(errors[0])} characters: {errors[0][:300]!r}..."
    if o.seconds > REFUSE_WITHIN_S:
        return f"refused after {o.seconds:.2f} s: {errors[0][:300]}"
    return None


def fuzz_workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Make tmp_path the working directory with the corpus, and stop `zerofit train` where its
    workers would start (also test_config_hostile.py's setup)."""
    monkeypatch.chdir(tmp_path)
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_PROCID", "SLURM_NTASKS"):
        monkeypatch.delenv(var, raising=False)  # under torchrun or srun: still the launcher path
    lines = [
        f"line {i}: the quick brown fox jumps over the lazy dog {i * i}\n" for i in range(2000)
    ]
    (tmp_path / CORPUS).write_text("".join(lines))
    monkeypatch.setattr(zerofit.launch.spawn, "spawn", lambda *args, **kwargs: 0)
    monkeypatch.setattr(zerofit.commands.train, "print_summary", lambda *args, **kwargs: None)
    monkeypatch.setattr(zerofit.commands.train, "_export_final", lambda *args, **kwargs: None)
    return tmp_path


@pytest.fixture
def fuzz_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    return fuzz_workdir(tmp_path, monkeypatch)


def test_base_config_is_accepted(fuzz_dir: Path) -> None:
    """The fuzz base itself must train (else every mutant would be refused for its sake)."""
    o = run_mutant(Mutant("base", base_text().encode()), fuzz_dir / "base.yaml")
    assert o.code == 0 and not o.crash, o.crash or o.err
    assert list((fuzz_dir / "runs").glob("*/config.yaml"))


def test_config_fuzz(fuzz_dir: Path) -> None:
    seeds = [FIXED_SEED, rotating_seed()]
    print(
        f"\nconfig fuzz seeds: {seeds[0]} (fixed), {seeds[1]} (replay: ZEROFIT_FUZZ_SEED={seeds[1]})"
    )
    run_mutant(Mutant("warm-up", base_text().encode()), fuzz_dir / "warm.yaml")  # first imports
    failures, codes, kinds = [], {0: 0, 2: 0}, set()
    start = time.perf_counter()
    for seed in seeds:
        for i, m in enumerate(mutants(seed, PER_SEED)):
            path = fuzz_dir / f"mutant-{seed}-{i}.yaml"
            o = run_mutant(m, path)
            kinds.add(m.kind)
            if o.code in codes:
                codes[o.code] += 1
            why = problem(o)
            if why:
                failures.append(
                    f"seed {seed} mutant {i} ({m.kind}, args {m.args!r:.200}, file {path}): {why}"
                )
            else:
                path.unlink()
    elapsed = time.perf_counter() - start
    print(
        f"config fuzz: {2 * PER_SEED} mutants in {elapsed:.1f} s: {codes[0]} accepted, {codes[2]} refused"
    )
    assert not failures, (
        f"{len(failures)} failure(s); replay: ZEROFIT_FUZZ_SEED={seeds[1]}\n"
        + "\n\n".join(failures[:5])
    )
    assert kinds == {f.__name__ for f in MUTATORS}
    assert codes[0] >= 20 and codes[2] >= PER_SEED, codes  # both outcomes, many refusals
