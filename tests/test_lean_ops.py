"""model.lean_ops: the memory-lean RMSNorm and SwiGLU give transformers' values and gradients,
keep less for backward, and are swapped in only where a class computes exactly that."""

from __future__ import annotations

import pytest
import torch
from torch import nn

pytest.importorskip("transformers")

from transformers import GemmaConfig, LlamaConfig  # noqa: E402
from transformers.models.gemma.modeling_gemma import GemmaMLP, GemmaRMSNorm  # noqa: E402
from transformers.models.llama.modeling_llama import LlamaMLP, LlamaRMSNorm  # noqa: E402

from zerofit.models.lean_ops import apply_lean_ops, rms_norm, swiglu  # noqa: E402


def _saved_bytes(fn, *args) -> int:  # noqa: ANN001
    """Bytes of the tensors autograd keeps for backward while ``fn(*args)`` runs (parameters
    excluded: they are kept anyway)."""
    params = {id(p) for a in args if isinstance(a, nn.Module) for p in a.parameters()}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        if id(t) not in params and t.dim() > 1:
            seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn(*args).float().sum().backward()
    return sum(seen.values())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_norm_matches_llama_values_and_gradients(dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    ref = LlamaRMSNorm(64, eps=1e-5)
    with torch.no_grad():
        ref.weight.copy_(torch.randn(64) * 0.1 + 1)
    ref = ref.to(dtype)
    x = torch.randn(3, 5, 64, dtype=dtype, requires_grad=True)
    x2 = x.detach().clone().requires_grad_()
    w2 = nn.Parameter(ref.weight.detach().clone())
    grad = torch.randn(3, 5, 64, dtype=dtype)
    want = ref(x)
    want.backward(grad)
    got = rms_norm(x2, w2, 1e-5)
    got.backward(grad)
    assert got.dtype == want.dtype and torch.equal(got, want)
    tol = {"rtol": 1e-5, "atol": 1e-6} if dtype == torch.float32 else {"rtol": 2e-2, "atol": 2e-2}
    torch.testing.assert_close(x2.grad, x.grad, **tol)
    torch.testing.assert_close(w2.grad, ref.weight.grad, **tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_swiglu_matches_silu_times_up(dtype: torch.dtype) -> None:
    torch.manual_seed(1)
    gate = torch.randn(4, 32, dtype=dtype, requires_grad=True)
    up = torch.randn(4, 32, dtype=dtype, requires_grad=True)
    g2, u2 = (t.detach().clone().requires_grad_() for t in (gate, up))
    grad = torch.randn(4, 32, dtype=dtype)
    want = torch.nn.functional.silu(gate) * up
    want.backward(grad)
    got = swiglu(g2, u2)
    got.backward(grad)
    tol = {"rtol": 1e-5, "atol": 1e-6} if dtype == torch.float32 else {"rtol": 2e-2, "atol": 2e-2}
    torch.testing.assert_close(got, want, **tol)
    torch.testing.assert_close(g2.grad, gate.grad, **tol)
    torch.testing.assert_close(u2.grad, up.grad, **tol)


def _llama_parts() -> tuple[LlamaRMSNorm, LlamaMLP]:
    cfg = LlamaConfig(hidden_size=64, intermediate_size=192, rms_norm_eps=1e-6)
    torch.manual_seed(2)
    return LlamaRMSNorm(64, eps=1e-6), LlamaMLP(cfg)


def test_lean_modules_keep_less_for_backward_and_give_the_same_gradients() -> None:
    norm, mlp = _llama_parts()
    model = nn.Sequential(norm, mlp).to(torch.bfloat16)
    x = torch.randn(2, 16, 64, dtype=torch.bfloat16)
    before = _saved_bytes(model, x.clone().requires_grad_())
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    changed = apply_lean_ops(model)
    assert changed == ["LlamaMLP", "LlamaRMSNorm"]
    after = _saved_bytes(model, x.clone().requires_grad_())
    # Eager Llama keeps x in fp32 and the normalised bf16 (6 B per hidden value) and act(gate)
    # beside gate, up and their product; lean keeps x (2 B) and gate, up and the product.
    hidden, inter = 2 * 16 * 64, 2 * 16 * 192
    assert before - after >= 4 * hidden + 2 * inter
    for p, g in zip(model.parameters(), grads, strict=True):
        torch.testing.assert_close(p.grad, g, rtol=2e-2, atol=2e-2)


def test_classes_computing_something_else_are_left_alone() -> None:
    cfg = GemmaConfig(hidden_size=64, intermediate_size=128, hidden_act="gelu_pytorch_tanh")
    gemma = nn.Sequential(GemmaRMSNorm(64), GemmaMLP(cfg))
    assert apply_lean_ops(gemma) == []
    assert all("forward" not in vars(m) for m in gemma.modules())


def test_meta_modules_are_probed_without_values() -> None:
    with torch.device("meta"):
        norm, mlp = _llama_parts()
    model = nn.Sequential(norm, mlp)
    assert apply_lean_ops(model) == ["LlamaMLP", "LlamaRMSNorm"]
    assert norm.weight.is_meta and "forward" in vars(norm)


@pytest.mark.parametrize("dropout", [0.0, 0.3])
def test_lora_delta_matches_the_module_by_module_update(dropout: float) -> None:
    from zerofit.models.lora_delta import lora_delta

    torch.manual_seed(3)
    x = torch.randn(2, 7, 16, dtype=torch.float64, requires_grad=True)
    a = torch.randn(4, 16, dtype=torch.float64, requires_grad=True)
    b = torch.randn(12, 4, dtype=torch.float64, requires_grad=True)
    grad = torch.randn(2, 7, 12, dtype=torch.float64)
    torch.manual_seed(9)
    got = lora_delta(x, a, b, dropout, 2.0)
    got.backward(grad)
    mine = [t.grad.clone() for t in (x, a, b)]
    for t in (x, a, b):
        t.grad = None
    torch.manual_seed(9)  # the same mask, drawn the same way
    mask = torch.empty_like(x, dtype=torch.bool).bernoulli_(1 - dropout)
    want = (x * mask / (1 - dropout)) @ a.t() @ b.t() * 2.0
    want.backward(grad)
    torch.testing.assert_close(got, want)
    for g, t in zip(mine, (x, a, b), strict=True):
        torch.testing.assert_close(g, t.grad)
    if dropout:
        assert not mask.all()  # the test did drop something


def _qkv(lean: bool, dropout: float = 0.1) -> nn.ModuleList:
    from zerofit.models.lora import LoRALinear

    torch.manual_seed(4)
    out = nn.ModuleList(
        LoRALinear(nn.Linear(64, 64, bias=False), 8, 16.0, dropout, lean) for _ in range(3)
    )
    with torch.no_grad():
        for p in out.parameters():  # the factors start uninitialised: fill them alike
            p.copy_(torch.randn(p.shape) * 0.1)
    for layer in out:
        layer.weight.requires_grad_(False)
    return out.to(torch.bfloat16)


def _qkv_saved(model: nn.Module, x: torch.Tensor) -> int:
    from zerofit.report.saved_tensors import saved_bytes

    return saved_bytes(model, lambda: sum(layer(x) for layer in model).float().sum())


def test_lean_lora_layers_share_their_input_and_keep_masks_as_bits() -> None:
    x = torch.randn(4, 32, 64, dtype=torch.bfloat16, requires_grad=True)
    module, lean = _qkv_saved(_qkv(False), x), _qkv_saved(_qkv(True), x)
    n = 4 * 32 * 64
    # lean: the input once (the caller's tensor), a bit per element for each mask, the rank-8
    # outputs; module by module each layer keeps at least a bf16 dropped copy and a 1 B mask more
    assert lean == 2 * n + 3 * (n // 8 + 2 * 4 * 32 * 8), lean
    assert module >= lean + 3 * (2 * n + n - n // 8), (module, lean)
    torch.testing.assert_close(_qkv(True).eval()[0](x), _qkv(False).eval()[0](x))


def test_a_compiled_block_keeps_what_eager_keeps_with_lora_dropout() -> None:
    """Compiled as part of a larger graph, the update stays one opaque operator: the compiler
    does not swap the shared input for each layer's dropped copy (it did: 2 B per element and
    layer more)."""
    x = torch.randn(4, 32, 64, dtype=torch.bfloat16, requires_grad=True)
    eager_model, compiled_model = _qkv(True), _qkv(True)
    eager = _qkv_saved(eager_model, x)
    torch._dynamo.reset()
    block = torch.compile(lambda t: sum(layer(t) for layer in compiled_model), fullgraph=True)
    from zerofit.report.saved_tensors import saved_bytes

    def loss() -> torch.Tensor:
        return block(x).float().sum()

    saved_bytes(compiled_model, loss)  # compiles
    assert saved_bytes(compiled_model, loss) == eager
    # in fp32, the same masks drawn from the same seed: the same values and gradients
    x32 = x.detach().float().requires_grad_()
    results = []
    for model in (eager_model.float(), compiled_model.float()):
        model.zero_grad()
        torch.manual_seed(0)
        out = block(x32) if model is compiled_model else sum(layer(x32) for layer in model)
        out.square().sum().backward()
        grads = [x32.grad.clone(), *(p.grad for p in model.parameters() if p.grad is not None)]
        x32.grad = None
        results.append((out.detach(), grads))
    torch.testing.assert_close(results[0], results[1])


@pytest.mark.parametrize("n", [1, 8, 13, 64 * 7])
def test_masks_pack_and_unpack_bit_for_bit(n: int) -> None:
    from zerofit.models.lora_delta import pack_mask, unpack_mask

    torch.manual_seed(n)
    mask = torch.rand(n) < 0.5
    packed = pack_mask(mask)
    assert packed.dtype == torch.uint8 and packed.numel() == -(-n // 8)
    assert torch.equal(unpack_mask(packed, mask), mask)


def test_the_fused_kernels_trace_whole() -> None:
    """On CUDA each kernel runs as one `torch.compile(fullgraph=True)` graph: traced here with
    Dynamo's eager backend (no compiler on CPU), a graph break would raise."""
    from zerofit.models import lean_ops, lora_delta

    torch.manual_seed(5)
    x = torch.randn(2, 8, 16, dtype=torch.bfloat16)
    w = torch.randn(16, dtype=torch.bfloat16)
    a, b = torch.randn(4, 16, dtype=torch.bfloat16), torch.randn(12, 4, dtype=torch.bfloat16)
    y, rstd = lean_ops._norm_fwd(x, w, 1e-6)
    out, mask, h = lora_delta._delta_fwd(x, a, b, 0.1, 2.0)
    grad = torch.randn_like(out)
    cases = [
        (lean_ops._norm_fwd, (x, w, 1e-6)),
        (lean_ops._norm_bwd, (y, x, w, rstd, True)),
        (lean_ops.swiglu_values, (x, x)),
        (lean_ops.swiglu_grads, (x, x, x)),
        (lora_delta._delta_fwd, (x, a, b, 0.1, 2.0)),
        (lora_delta._delta_fwd, (x, a, b, 0.0, 2.0)),
        (lora_delta._delta_bwd, (grad, x, mask, h, a, b, 0.1, 2.0)),
        (lora_delta._delta_bwd, (grad, x, None, h, a, b, 0.0, 2.0)),
    ]
    for fn, args in cases:
        torch._dynamo.reset()
        torch.compile(fn, backend="eager", fullgraph=True, dynamic=False)(*args)


@pytest.mark.parametrize("dropout", [0.0, 0.3])
def test_a_gated_down_projection_gives_the_plain_update_and_its_gradients(dropout: float) -> None:
    """``forward_gated(act, gate, up)`` equals ``forward(act)`` for ``act = silu(gate) * up``:
    values, and gradients reaching gate, up and the factors (the same mask from the same seed)."""
    from zerofit.models.lean_ops import swiglu
    from zerofit.models.lora import LoRALinear

    torch.manual_seed(6)
    layer = LoRALinear(nn.Linear(24, 10, bias=False), 4, 8.0, dropout).double()
    layer.weight.requires_grad_(False)
    with torch.no_grad():
        for p in (layer.lora_A.weight, layer.lora_B.weight):
            p.copy_(torch.randn(p.shape))
    gate0, up0 = (
        torch.randn(2, 5, 24, dtype=torch.float64),
        torch.randn(2, 5, 24, dtype=torch.float64),
    )
    grad = torch.randn(2, 5, 10, dtype=torch.float64)
    results = []
    for gated in (False, True):
        layer.zero_grad()
        gate, up = gate0.clone().requires_grad_(), up0.clone().requires_grad_()
        act = swiglu(gate, up)
        torch.manual_seed(9)
        out = layer.forward_gated(act, gate, up) if gated else layer(act)
        out.backward(grad)
        results.append(
            (out.detach(), gate.grad, up.grad, layer.lora_A.weight.grad, layer.lora_B.weight.grad)
        )
    # the SwiGLU's gradient is computed in fp32 (lean_ops), here once per path and then summed
    torch.testing.assert_close(results[0], results[1], rtol=1e-6, atol=1e-5)


def test_a_lean_mlp_with_a_lora_down_projection_keeps_gate_and_up_only() -> None:
    """The MLP keeps gate and up (the SwiGLU's); the adapted down projection keeps no product."""
    from zerofit.models.lora import LoRALinear

    def mlp() -> nn.Module:
        torch.manual_seed(4)
        _, block = _llama_parts()
        block.down_proj = LoRALinear(block.down_proj, 8, 16.0, 0.0)
        for p in block.parameters():
            p.requires_grad_(False)
        block.down_proj.lora_A.weight.requires_grad_(True)
        block.down_proj.lora_B.weight.requires_grad_(True)
        with torch.no_grad():
            block.down_proj.lora_A.weight.normal_()
        apply_lean_ops(block)
        return block.to(torch.bfloat16)

    from zerofit.report.saved_tensors import saved_bytes

    x = torch.randn(2, 16, 64, dtype=torch.bfloat16, requires_grad=True)
    lean = mlp()
    kept = saved_bytes(lean, lambda: lean(x).float().sum())
    plain = mlp()
    plain.down_proj.forward_gated = None  # as before: the update keeps its input, the product
    before = saved_bytes(plain, lambda: plain(x).float().sum())
    ffn = lean.gate_proj.out_features
    rank_out = 2 * 16 * 8 * 2  # the rank-8 intermediate, bf16
    assert kept == 2 * 2 * 16 * ffn * 2 + rank_out, kept  # gate and up
    assert before - kept == 2 * 16 * ffn * 2  # the product
