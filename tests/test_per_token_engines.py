"""Per-token losses (DPO's input) under the engines' wrappers, 2 CPU ranks on gloo: DDP, FSDP2
(zerofit's sharding, per block and by size, which puts the head in a unit of its own, resharded
after forward) and DeepSpeed ZeRO-3 with every parameter partitioned. ``per_token=True`` reaches
the model through each wrapper, and for random per-token upstream gradients every parameter's
gradient, summed over the ranks, equals one process's on the whole batch through the full logits
and F.cross_entropy(reduction="none"): with the fused head (the trained head's gradient recomputed
in backward, where the engine has gathered its weight again) and the plain one, the head trained
or frozen."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.dist

SCRIPT = """
import copy, sys
import torch, torch.distributed as dist
from zerofit.models import build_model
from zerofit.distributed.parallelize import materialize_

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
gen = torch.Generator().manual_seed(1)
tokens = torch.randint(0, 512, (4, 32), generator=gen)
targets = torch.randint(0, 512, (4, 32), generator=gen)
targets[:, :6] = -100
upstream = torch.randn(4, 32, generator=gen)
mine = slice(2 * rank, 2 * rank + 2)


def wrapped(engine, model):
    if engine == "ddp":
        from torch.nn.parallel import DistributedDataParallel
        return DistributedDataParallel(model), lambda p: p.grad * world
    if engine.startswith("fsdp"):
        from torch.distributed.device_mesh import init_device_mesh
        from zerofit.backends.fsdp.sharding import apply_fsdp
        apply_fsdp(model, model.layers, init_device_mesh("cpu", (world,)),
                   param_dtype=torch.float32, reduce_dtype=torch.float32,
                   reshard_after_forward=True, cpu_offload=False,
                   wrap="size" if engine == "fsdp-size" else "block", min_num_params=20_000)
        return model, lambda p: p.grad.full_tensor() * world
    import deepspeed
    from deepspeed.utils import safe_get_full_grad
    deepspeed.init_distributed(dist_backend="gloo")
    config = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
              "optimizer": {"type": "AdamW", "params": {"lr": 0.0, "torch_adam": True}},
              "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0}}
    trained = [p for p in model.parameters() if p.requires_grad]
    engine_, *_ = deepspeed.initialize(model=model, model_parameters=trained, config=config)
    return engine_, lambda p: safe_get_full_grad(p) * world


def check(engine):
    for chunk in (16, 0):
        for head_trains in (True, False):
            spec = build_model(preset="tiny", overrides={"n_layers": 2, "dim": 64}, loss_chunk=chunk)
            materialize_(spec.module, torch.device("cpu"), init_seed=0, init_param_=spec.init_param_)
            spec.module.output.weight.requires_grad_(head_trains)
            reference = copy.deepcopy(spec.module)
            logits = reference(tokens).float()  # the plain loss on full logits: the reference
            plain = torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten(),
                                                      reduction="none")
            (plain.view_as(targets) * upstream).sum().backward()
            model, full_grad = wrapped(engine, copy.deepcopy(spec.module))
            nll = model(tokens[mine], targets[mine], per_token=True)
            loss = (nll * upstream[mine]).sum()
            model.backward(loss) if engine == "zero3" else loss.backward()
            inner = model.module if engine in ("ddp", "zero3") else model
            named = zip(inner.named_parameters(), reference.named_parameters())
            for (name, p), (_, want) in named:
                if want.grad is None:
                    assert not p.requires_grad, name
                    continue
                msg = f"{engine} chunk={chunk} head_trains={head_trains} {name}"
                atol = 1e-5 * want.grad.abs().max().item()  # summation order: engines vs one process
                torch.testing.assert_close(full_grad(p), want.grad, rtol=1e-4, atol=atol, msg=msg)


# One launch checks every engine named (torch's import is most of a launch's cost); an engine's
# failure is reported under its name and the next engine still runs, on a fresh group barrier.
for engine in sys.argv[1:]:
    try:
        check(engine)
        verdict = "ok"
    except Exception as error:  # reported per engine; the test names the one that failed
        verdict = "FAILED " + repr(error)[:2000].replace(chr(10), " ")
    dist.barrier()
    print(f"{verdict} {engine} rank {rank}", flush=True)
dist.destroy_process_group()
"""


ENGINES = ["ddp", "fsdp", "fsdp-size", "zero3"]


@pytest.fixture(scope="module")
def engine_verdicts(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Every engine checked in one 2-rank launch; its output, one verdict line per engine and rank."""
    engines = [e for e in ENGINES if e != "zero3" or importlib.util.find_spec("deepspeed")]
    script = tmp_path_factory.mktemp("per_token") / "per_token_engine.py"
    script.write_text(SCRIPT)
    src = str(Path(__file__).resolve().parents[1] / "src")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
           "--standalone", str(script), *engines]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": src, "OMP_NUM_THREADS": "1"}
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    except subprocess.TimeoutExpired as hung:  # hang guard: engines checked so far still count
        out = hung.stdout or b""
        text_out = out.decode(errors="replace") if isinstance(out, bytes) else out
        return text_out + "\nhung after 900 s"
    return proc.stdout + "\n" + proc.stderr[-3000:]


@pytest.mark.parametrize("engine", ENGINES)
def test_per_token_gradients_under_the_engines(engine: str, engine_verdicts: str) -> None:
    if engine == "zero3":
        pytest.importorskip("deepspeed")
    for rank in (0, 1):
        assert f"ok {engine} rank {rank}" in engine_verdicts, engine_verdicts[-4000:]
