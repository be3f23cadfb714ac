import importlib.util
import sys


def probe(tag):
    mod = sys.modules.get("torchao", "absent")
    try:
        spec = importlib.util.find_spec("torchao")
        got = spec.origin if spec else None
    except Exception as e:  # noqa: BLE001
        got = f"raised {e!r}"
    print(tag, "| sys.modules:", repr(mod)[:80], "| find_spec:", got, flush=True)


probe("start")
print("path", sys.path[:5])
from zerofit.launch.run_config import load_config
from zerofit.launch import forkserver

ov = ["model.hf=/tmp/fx/model-1b", "model.random_init=true", "data.source=/tmp/fx/chat.jsonl", "train.steps=1", "parallel.backend=ddp"]
cfg = load_config("configs/finetune-qlora.yaml", ov)
probe("config loaded")
forkserver.start(forkserver.preload_for(True))
probe("forkserver")
from zerofit.launch import prepare
probe("prepare imported")
from zerofit.launch.resolve import resolve
r = resolve(prepare._expand_user(cfg), 1, "cuda")
probe("resolved")
from zerofit.launch.requirements import check_installed, needs
print([n.module for n in needs(r)])
check_installed(r)
probe("checked")
