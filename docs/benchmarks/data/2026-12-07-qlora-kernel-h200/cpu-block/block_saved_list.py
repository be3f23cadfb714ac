"""List what one QLoRA HF Llama block keeps for backward on CPU, compiled and eager: each kept
tensor's shape, dtype and bytes per token (a 2-layer model's kept tensors less a 1-layer
model's), with lora_block_bytes.py's model (hidden 1024, Llama-3-8B's proportions, LoRA r16 on
every linear layer over an NF4 base, dropout 0.05, lean ops, 512 tokens).

    python block_saved_list.py OUT.json   # from the repository root"""

import collections, json, sys

import torch

sys.path.insert(0, "benchmarks")
from lora_block_bytes import build, TOKENS, HIDDEN
from zerofit.distributed.parallelize import apply_compile


def listing(layers, dropout, compiled):
    torch._dynamo.reset()
    model = build(layers, dropout)
    if compiled:
        apply_compile(model.model.layers)
    x = torch.randint(0, 1024, TOKENS)
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    for attempt in range(2):
        kept = {}

        def pack(t):
            s = t.untyped_storage()
            if s.data_ptr() not in params:
                kept[s.data_ptr()] = (
                    tuple(t.shape),
                    str(t.dtype).replace("torch.", ""),
                    s.nbytes(),
                )
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            loss = model(input_ids=x, use_cache=False).logits.float().sum()
        loss.backward()
    return collections.Counter(kept.values())


out = {"torch": torch.__version__, "hidden": HIDDEN, "tokens": TOKENS[1], "ways": {}}
for dropout in (0.05,):
    for compiled in (True, False):
        a, b = listing(1, dropout, compiled), listing(2, dropout, compiled)
        diff = b - a
        tot = sum(k[2] * n for k, n in diff.items())
        print(
            f"compiled={compiled} dropout={dropout}: {tot / (TOKENS[0] * TOKENS[1] * HIDDEN):.2f} B per token-hidden"
        )
        rows = []
        for (shape, dt, nb), n in sorted(diff.items(), key=lambda kv: -kv[0][2]):
            print(f"   {n} x {shape} {dt} {nb / (TOKENS[1]):.0f} B/token each")
            rows.append(
                {"count": n, "shape": list(shape), "dtype": dt, "bytes_per_token": nb / TOKENS[1]}
            )
        out["ways"]["compiled" if compiled else "eager"] = {
            "bytes_per_token_h": tot / (TOKENS[0] * TOKENS[1] * HIDDEN),
            "kept": rows,
        }
json.dump(out, open(sys.argv[1], "w"), indent=1)
