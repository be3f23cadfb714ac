"""DPO end to end on preference pairs (gloo processes on CPU): the first step's loss is ln 2 (the
policy is its reference), it falls, the reference is the base with the adapters off (LoRA) or the
starting model's precomputed log-probs (full), the step loss is the mean over every pair of the
global batch, the engines agree, a resume repeats the run exactly, and the adapters export."""

from __future__ import annotations

import importlib.util
import json
import math
import random
import shutil
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path

import pytest
import torch
from conftest import POOL, TINY, deep_update, fixture_run, losses, wait_all, write_config, zerofit
from sft_helpers import WORDS, make_tokenizer, write_jsonl

from zerofit.errors import UserError
from zerofit.launch.run_config import config_from_dict
from zerofit.train.preference import dpo_loss, pair_logps

pytestmark = [pytest.mark.dist, pytest.mark.slow]
RTOL = 1e-5  # summation order only (as tests/test_parity.py)
LORA = {"model": {"lora": {"rank": 8, "alpha": 16, "dropout": 0.0}}}


def write_pairs(path: Path, n: int, seed: int = 0) -> Path:
    """Conversational pairs: the chosen answer reverses the user's words, the rejected one repeats
    one word the chosen never use (a preference a few steps can learn)."""
    rng = random.Random(seed)
    lines = []
    said = [w for w in WORDS if w != "fish"]
    for _ in range(n):
        words = rng.choices(said, k=rng.randint(2, 6))
        other = ["fish"] * rng.randint(2, 6)
        turn = [{"role": "user", "content": " ".join(words)}]
        lines.append({
            "prompt": turn,
            "chosen": [{"role": "assistant", "content": " ".join(reversed(words))}],
            "rejected": [{"role": "assistant", "content": " ".join(other)}],
        })  # fmt: skip
    return write_jsonl(path, lines)


@pytest.fixture(scope="module")
def pairs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    root = tmp_path_factory.mktemp("dpo")
    tok = make_tokenizer(root / "tok")
    src = write_pairs(root / "pairs.jsonl", 300)
    extra = {
        "data": {"source": str(src), "format": "preference", "tokenizer": str(tok),
                 "max_tokens": None, "val_fraction": 0.1},
        "train": {"objective": "dpo", "steps": 10, "micro_batch_size": 4, "eval_every": 10},
        "optim": {"lr": 3e-3, "warmup_steps": 0},
        "checkpoint": {"every": 5},
    }  # fmt: skip
    return root, extra


def _train(pairs: tuple[Path, dict], name: str, nproc: str, extra: dict) -> Path:
    return fixture_run(pairs, name, nproc, extra)[0]


# Full DPO at a tenth of LoRA's rate: at 3e-3 one step saturates every pair's sigmoid, and AdamW
# scales the near-zero gradients that follow up to full steps, summation noise included (the
# engines then part at 1e-3 by step 3, precomputed or copy alike). A constant rate: the 5-step
# runs take the 10-step runs' first 5 steps.
FULL = {"optim": {"lr": 3e-4, "min_lr_ratio": 1.0}}
COPY = deep_update(FULL, {"train": {"dpo": {"reference": "copy"}}})
SHORT = deep_update(COPY, {"train": {"steps": 5, "eval_every": 5}})  # engine parity: 5 steps
CASES = {
    "lora-ddp": ("2", deep_update(LORA, {"parallel": {"backend": "ddp"}})),
    "lora-fsdp": ("2", deep_update(LORA, {"parallel": {"backend": "fsdp"}})),
    "full-fsdp": ("2", deep_update(FULL, {"parallel": {"backend": "fsdp"}})),
    "copy-fsdp": ("2", deep_update(COPY, {"parallel": {"backend": "fsdp"}})),
    "copy-ddp": ("2", deep_update(SHORT, {"parallel": {"backend": "ddp"}})),
    "lora-accum": (
        "1", deep_update(LORA, {"parallel": {"backend": "ddp"}, "train": {"grad_accum_steps": 2}})
    ),
}  # fmt: skip
if importlib.util.find_spec("deepspeed") is not None:
    CASES["lora-zero3"] = ("2", deep_update(LORA, {"parallel": {"backend": "deepspeed",
                                                               "deepspeed": {"stage": 3}}}))  # fmt: skip
    CASES["copy-zero3"] = ("2", deep_update(SHORT, {"parallel": {"backend": "deepspeed",
                                                                "deepspeed": {"stage": 3}}}))  # fmt: skip


@pytest.fixture(scope="module")
def runs(pairs: tuple[Path, dict]) -> Iterator[dict[str, Future[Path]]]:
    out = {name: POOL.submit(_train, pairs, name, *case) for name, case in CASES.items()}
    yield out
    wait_all(out.values())


def records(run_dir: Path) -> list[dict]:
    return [json.loads(r) for r in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("name", ["lora-fsdp", "full-fsdp", "copy-fsdp"])
def test_first_step_is_ln2_and_the_loss_falls(runs, name: str) -> None:  # noqa: ANN001
    """Step 1 runs the starting weights, which are the reference: every pair's margin is 0."""
    run_dir = runs[name].result()
    got = losses(run_dir)
    assert got[1] == pytest.approx(math.log(2), abs=1e-5), got
    assert sum(got[s] for s in (8, 9, 10)) / 3 < got[1] - 0.05, got
    last = records(run_dir)[-1]
    assert last["dpo_accuracy"] > 0.5 and last["dpo_margin"] > 0, last
    assert last["dpo_reward_chosen"] - last["dpo_reward_rejected"] == pytest.approx(
        last["dpo_margin"], abs=1e-6
    )
    assert 0 < last["eval_loss"] < math.log(2), last
    # the held-out pairs: -log sigmoid is convex, so a mean loss under ln 2 means a mean margin > 0
    assert last["eval_dpo_margin"] > 0 and 0 < last["eval_dpo_accuracy"] <= 1, last
    precomputed = (run_dir / "reference_logps.pt").is_file()
    assert precomputed == (name == "full-fsdp")  # LoRA: the adapters-off base, nothing stored


def test_engines_and_accumulation_agree(runs) -> None:  # noqa: ANN001
    base = losses(runs["lora-fsdp"].result())
    for name in [n for n in CASES if n.startswith("lora-") and n != "lora-fsdp"]:
        other = losses(runs[name].result())
        worst = max(abs(other[s] - base[s]) / abs(base[s]) for s in base)
        assert worst <= RTOL, (name, {s: (base[s], other[s]) for s in base})


def test_the_reference_copy_agrees_across_engines_and_with_precomputed(runs) -> None:  # noqa: ANN001
    """A frozen copy of the starting model (sharded by FSDP2 and ZeRO-3, replicated by DDP) gives
    the losses of the precomputed reference, step by step and on the held-out pairs, and the
    engines agree with it."""
    copied = records(runs["copy-fsdp"].result())
    precomputed = records(runs["full-fsdp"].result())
    for key in ("loss", "eval_loss", "eval_dpo_margin", "dpo_logp_chosen", "dpo_reward_chosen"):
        a = {r["step"]: r[key] for r in copied if key in r}
        b = {r["step"]: r[key] for r in precomputed if key in r}
        assert a.keys() == b.keys() and a, key
        scale = max(abs(v) for v in b.values())  # rewards start at 0: relative to the largest
        assert all(abs(a[s] - b[s]) <= RTOL * scale for s in a), (key, a, b)
    base = losses(runs["copy-fsdp"].result())
    for name in [n for n in CASES if n.startswith("copy-") and n != "copy-fsdp"]:
        other = losses(runs[name].result())
        assert sorted(other) == [1, 2, 3, 4, 5], (name, other)
        worst = max(abs(other[s] - base[s]) / abs(base[s]) for s in other)
        assert worst <= RTOL, (name, {s: (base[s], other[s]) for s in other})


class _Scores(torch.nn.Module):
    """A stand-in model: each place's negative log-likelihood is a fixed function of its token."""

    def forward(self, inputs, targets, positions=None, documents=None, per_token=False):  # noqa: ANN001, ANN201
        return (inputs.float() * 0.37).sin() + 1.0


def test_step_loss_is_the_mean_over_the_global_batchs_pairs() -> None:
    """Micro-batches of 1 and 3 pairs: weighted as n_a / N, their losses make the mean over all
    4 pairs (a mean of micro-batch means would weight the lone pair 3x)."""
    from zerofit.distributed.mesh import DistContext
    from zerofit.train.objectives import Preference
    from zerofit.train.reference import Precomputed

    cfg = config_from_dict(deep_update(TINY, {"train": {"objective": "dpo"},
                                              "data": {"format": "preference"}}))  # fmt: skip
    ctx = DistContext(0, 1, 0, torch.device("cpu"), 1, 1)
    table = torch.tensor([[0.5, -0.5], [0.1, 0.2], [-1.0, 0.3], [0.0, 0.0]])
    objective = Preference(cfg, ctx, Precomputed({"train": table}))
    row = lambda pairs: (  # noqa: E731
        torch.arange(8)[None] + pairs.abs().sum(), torch.zeros(1, 8, dtype=torch.long),
        torch.arange(8)[None], pairs[None],
    )  # fmt: skip
    one = row(torch.tensor([0, 1, 1, -1, -1, 0, 0, 0]))
    three = row(torch.tensor([2, -2, 0, 3, -3, 4, -4, 0]))
    weights, _ = objective.weights([one, three])
    torch.testing.assert_close(torch.stack(weights), torch.tensor([0.25, 0.75]))
    step = sum(w * objective.loss(_Scores(), b) for w, b in zip(weights, [one, three], strict=True))
    per_pair = []
    for batch in (one, three):
        ids, c, r = pair_logps(_Scores()(*batch[:3]), batch[3])
        per_pair.append(dpo_loss(c, r, table[ids, 0], table[ids, 1], 0.1)[0])
    torch.testing.assert_close(step, torch.cat(per_pair).mean())
    assert objective.record()["pairs"] == 4


@pytest.mark.parametrize("name", ["full-fsdp", "copy-fsdp"])
def test_resume_repeats_the_run_exactly(pairs, runs, name: str) -> None:  # noqa: ANN001
    """A resumed DPO run reads the precomputed reference back, or builds the frozen copy again
    from the model's source (the starting weights, not the checkpoint's), and logs the same
    losses."""
    full = runs[name].result()
    cut = pairs[0] / f"cut-{name}"
    shutil.copytree(full / "checkpoints" / "step_00000005", cut / "checkpoints" / "step_00000005")
    shutil.copy(full / "config.yaml", cut / "config.yaml")
    if name == "full-fsdp":
        shutil.copy(full / "reference_logps.pt", cut / "reference_logps.pt")
    fixture_run(pairs, cut.name, "2", CASES[name][1], "--resume")
    before, after = losses(full), losses(cut)
    assert sorted(after) == [6, 7, 8, 9, 10]
    assert all(after[s] == before[s] for s in after), {s: (before[s], after[s]) for s in after}


def test_lora_dpo_exports_a_peft_adapter(pairs, runs) -> None:  # noqa: ANN001
    root, _ = pairs
    run_dir = runs["lora-ddp"].result()
    proc = zerofit("export", str(run_dir), "--out", str(root / "adapter"), "--adapter", cwd=root)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (root / "adapter" / "adapter_config.json").is_file()


def test_pair_sums_and_loss_by_hand() -> None:
    """pair_logps and dpo_loss against a hand-written loop, values and gradients."""
    gen = torch.Generator().manual_seed(0)
    nll = torch.rand(3, 8, generator=gen, requires_grad=True)
    ids = torch.tensor([[0, 1, 1, -1, -1, 0, 2, 2], [-2, -2, 0, 3, 3, -3, 0, 0],
                        [4, -4, -4, 0, 0, 0, 0, 0]])  # fmt: skip
    got, chosen, rejected = pair_logps(nll, ids)
    assert got.tolist() == [0, 1, 2, 3]
    for k, g in enumerate(got.tolist()):
        assert chosen[k].item() == pytest.approx(-nll[ids == g + 1].sum().item())
        assert rejected[k].item() == pytest.approx(-nll[ids == -(g + 1)].sum().item())
    ref_c, ref_r = chosen.detach() + 0.3, rejected.detach() - 0.2
    losses_, rc, rr = dpo_loss(chosen, rejected, ref_c, ref_r, beta=0.5, label_smoothing=0.1)
    z = 0.5 * ((chosen - ref_c) - (rejected - ref_r))
    want = -0.9 * torch.nn.functional.logsigmoid(z) - 0.1 * torch.nn.functional.logsigmoid(-z)
    torch.testing.assert_close(losses_, want)
    (g1,) = torch.autograd.grad(losses_.sum(), nll, retain_graph=True)
    (g2,) = torch.autograd.grad(want.sum(), nll)
    torch.testing.assert_close(g1, g2)
    same, *_ = dpo_loss(chosen, rejected, chosen.detach(), rejected.detach(), beta=3.0)
    torch.testing.assert_close(same, torch.full_like(same, math.log(2)))


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        ({"train": {"objective": "dpo"}}, "set data.format: preference"),
        ({"data": {"format": "preference"}}, "holds pairs for train.objective: dpo"),
        ({"train": {"objective": "dpo", "dpo": {"reference": "adapters_off"}},
          "data": {"format": "preference"}}, "give model.lora.rank > 0"),
        (deep_update(LORA, {"train": {"objective": "dpo", "dpo": {"reference": "copy"}},
                            "data": {"format": "preference"}}), "for full fine-tuning"),
    ],
)  # fmt: skip
def test_objective_and_data_go_together(extra: dict, says: str) -> None:
    from zerofit.config import validate

    with pytest.raises(UserError, match=says):
        validate(config_from_dict(deep_update(TINY, extra)))


@pytest.mark.parametrize(
    ("lora", "reference", "forward"),
    [(16, "auto", True), (16, "adapters_off", True), (16, "precomputed", False),
     (0, "auto", False), (0, "copy", True)],
)  # fmt: skip
def test_the_planner_counts_the_reference_forward(
    tmp_path: Path, lora: int, reference: str, forward: bool
) -> None:
    """The adapters-off reference runs one more forward a micro-batch: the forecast compute grows
    by the forward's share of the training FLOPs; a precomputed reference costs no step time."""
    from dataclasses import replace

    from zerofit.launch.run_config import load_config
    from zerofit.models.shape import shape_from_config
    from zerofit.planner.memory import strategy_for, workload_for
    from zerofit.planner.shape import Hardware
    from zerofit.planner.speed import forward_share, predict

    extra = {
        "model": {"preset": "llama3-1b", "overrides": {}, "lora": {"rank": lora}},
        "data": {"format": "preference"},
        "train": {"objective": "dpo", "dpo": {"reference": reference}},
    }
    cfg = load_config(write_config(tmp_path / "c.yaml", extra), ["parallel.backend=ddp"])
    m, w, s = shape_from_config(cfg), workload_for(cfg, 1), strategy_for(cfg)
    assert w.reference_forward is forward
    hw = Hardware(1, 80 * 2**30, peak_flops=989e12, mem_bw=4.8e12)
    plain = predict(m, replace(w, reference_forward=False), s, hw).compute
    want = plain * (1 + forward_share(m, w)) if forward else plain
    assert predict(m, w, s, hw).compute == pytest.approx(want)


def test_plan_says_what_the_reference_costs(tmp_path: Path) -> None:
    from zerofit.commands.plan import objective_lines
    from zerofit.launch.run_config import load_config
    from zerofit.planner.memory import workload_for

    def lines(extra: dict) -> list[str]:
        cfg = load_config(write_config(tmp_path / "c.yaml", extra), [])
        return objective_lines(cfg, workload_for(cfg, 1))

    dpo = {"data": {"format": "preference"}, "train": {"objective": "dpo"}}
    assert "adapters off: one more forward" in lines(deep_update(dpo, LORA))[0]
    assert "precomputed before the first step" in lines(dpo)[0]
    tiny_copy = lines(deep_update(dpo, COPY))[0]  # TINY: 1.84M parameters in fp32
    assert "a frozen copy of the model (0.01 GiB" in tiny_copy and "one more forward" in tiny_copy
    assert lines({}) == []


def test_the_pairs_are_indexed_on_the_host() -> None:
    """The objective indexes a batch's pairs from the host's copy (a `nonzero` or `unique` on the
    GPU waits for it) and hands the index to the reference; sums from the index are those from
    the pairs tensor."""
    from zerofit.distributed.mesh import DistContext
    from zerofit.train.objectives import Preference
    from zerofit.train.preference import PairIndex, pair_index

    gen = torch.Generator().manual_seed(1)
    nll = torch.rand(2, 8, generator=gen)
    pairs = torch.tensor([[0, 3, 3, -3, 0, 1, -1, 0], [-2, 2, 0, 5, -5, -5, 0, 0]])
    for a, b in zip(pair_logps(nll, pair_index(pairs)), pair_logps(nll, pairs), strict=True):
        torch.testing.assert_close(a, b)
    seen = []

    class Spy:
        def logps(self, model, batch, index, split):  # noqa: ANN001, ANN201
            seen.append(index)
            return torch.zeros(index.ids.numel()), torch.zeros(index.ids.numel())

    cfg = config_from_dict(deep_update(TINY, {"train": {"objective": "dpo"},
                                              "data": {"format": "preference"}}))  # fmt: skip
    objective = Preference(cfg, DistContext(0, 1, 0, torch.device("cpu"), 1, 1), Spy())
    batch = (torch.arange(16).view(2, 8), torch.zeros(2, 8, dtype=torch.long),
             torch.arange(8).repeat(2, 1), pairs)  # fmt: skip
    objective.loss(_Scores(), batch)
    assert isinstance(seen[0], PairIndex) and seen[0].ids.tolist() == [0, 1, 2, 4]


def test_the_progress_line_and_summary_show_the_preference_figures() -> None:
    from zerofit.report.progress import format_record, summary_table

    record = {"loss": 0.5, "dpo_accuracy": 0.75, "dpo_margin": 1.25}
    assert "acc 0.75  margin 1.250" in format_record(record)
    assert "acc" not in format_record({"loss": 0.5})
    rows = summary_table({"step": 3, **record}).rows
    assert ["DPO (last window)", "accuracy 0.75, reward margin 1.250"] in rows
    held = {"eval_loss": 0.6, "eval_dpo_accuracy": 0.625, "eval_dpo_margin": 0.5}
    assert "eval 0.6000  eval acc 0.62" in format_record(held)
    rows = summary_table({"step": 3, **record, **held}).rows
    assert ["DPO (held out)", "accuracy 0.62, reward margin 0.500"] in rows
