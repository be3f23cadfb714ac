"""What a compiled function keeps from its forward for its backward: the partitioned forward
graph's outputs beyond the function's own (torch.compile with AOTAutograd's min-cut partitioner,
as Inductor partitions; the graphs run as traced, not code-generated)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch._dynamo.backends.common import aot_autograd
from torch._functorch.partitioners import min_cut_rematerialization_partition


def kept_for_backward(fn: Callable[..., torch.Tensor], *args: torch.Tensor) -> list[torch.Tensor]:
    """The fake tensors (shape and dtype) compiled `fn(*args)` saves for its backward, after one
    forward and backward. `fn` returns one tensor, which the forward graph returns first."""
    graphs: list[torch.fx.GraphModule] = []

    def forward_compiler(gm: torch.fx.GraphModule, _inputs: list) -> Callable:
        graphs.append(gm)
        return gm

    backend = aot_autograd(
        fw_compiler=forward_compiler,
        bw_compiler=lambda gm, _inputs: gm,
        partition_fn=min_cut_rematerialization_partition,
    )
    torch._dynamo.reset()
    out = torch.compile(fn, backend=backend, fullgraph=True)(*args)
    out.float().square().sum().backward()
    (graph,) = graphs
    (outputs,) = next(n for n in graph.graph.nodes if n.op == "output").args
    values = [n.meta["val"] for n in outputs if isinstance(n, torch.fx.Node)]
    return [v for v in values[1:] if isinstance(v, torch.Tensor)]
