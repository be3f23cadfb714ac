"""zerofit_varlen, the packed-document attention of HF models (``zerofit.models.hf_attention``).

On CPU the model keeps transformers' mask and SDPA (test_hf checks it against transformers). The
CUDA branch is driven here on CPU by declaring CPU a "varlen" device: the adapter then passes the
documents' bounds to every layer and no mask is built, and each layer either runs the kernel call
(replaced by a per-document SDPA reference, to check the reshapes around it) or the dense fallback
(fp32, or a GPU before Ampere). Each must give exactly the losses and gradients of transformers'
own masked SDPA. The real kernel is checked against SDPA on a GPU in test_gpu.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from test_hf import CONFIGS, _batch, _ours, _saved
from test_hf_families import SIZES

from zerofit.models import build_model, doc_attention, hf_head
from zerofit.models import hf_attention as va

transformers = pytest.importorskip("transformers")


def _per_document_reference(q, k, v, cu, cu_k, max_q, max_k, *, scale=None, **kw):  # noqa: ANN001, ANN003, ANN202
    """What varlen_attn computes, one document at a time: q [T, H, D], k/v [T, Hkv, D]."""
    rep = q.shape[1] // k.shape[1]
    out = torch.empty_like(q)
    bounds = cu.tolist()
    for lo, hi in zip(bounds[:-1], bounds[1:], strict=True):
        qd, kd, vd = (x[lo:hi].transpose(0, 1) for x in (q, k, v))
        kd, vd = kd.repeat_interleave(rep, 0), vd.repeat_interleave(rep, 0)
        o = F.scaled_dot_product_attention(qd, kd, vd, is_causal=True, scale=scale)
        out[lo:hi] = o.transpose(0, 1)
    return out


def _packed_batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    tokens, targets = _batch(SIZES["vocab_size"], 24)
    positions = torch.tensor(
        [list(range(10)) + list(range(9)) + list(range(5)), list(range(17)) + list(range(7))]
    )
    return tokens, targets, positions


def _loss_and_grads(model: torch.nn.Module, batch: tuple) -> tuple[float, dict]:
    model.zero_grad(set_to_none=True)
    loss = model(*batch)
    loss.backward()
    return loss.item(), {n: p.grad.clone() for n, p in model.named_parameters()}


def _same_heads_only(q, k, v, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
    """A kernel that refuses fewer key/value heads than query heads."""
    if q.shape[1] != k.shape[1]:
        raise RuntimeError("number of heads in key/value must equal query's")
    return _per_document_reference(q, k, v, *args, **kwargs)


@pytest.mark.parametrize("branch", ["kernel", "kernel-same-heads", "dense", "dense-pre-ampere"])
@pytest.mark.parametrize("family", ["llama", "qwen3", "gemma"])
def test_varlen_branch_equals_transformers_masked_sdpa(
    family: str, branch: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A kernel that takes grouped key/value heads gets them as they are (SIZES: 2 for 4 query
    heads); one that refuses them gets them repeated. Either way, transformers' numbers."""
    folder, reference = _saved(tmp_path, family)
    model = _ours(folder, reference)
    assert model.varlen and model.hf.config._attn_implementation == va.NAME
    batch = _packed_batch()
    want_loss, want_grads = _loss_and_grads(model, batch)  # CPU: transformers' mask + SDPA

    calls = []
    kernel = _same_heads_only if branch == "kernel-same-heads" else _per_document_reference

    def fake_varlen(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        calls.append((args[3].tolist(), args[1].shape[1]))
        return kernel(*args, **kwargs)

    monkeypatch.setattr(va, "runs_varlen", lambda device: True)
    monkeypatch.setattr(hf_head, "runs_varlen", lambda device: True)
    monkeypatch.setattr(va, "_varlen", lambda: fake_varlen)
    monkeypatch.setattr(va, "_GQA", {})
    if branch != "dense":  # fp32 stands in for bf16 here
        monkeypatch.setattr(va, "HALF", (torch.float32,))
    monkeypatch.setattr(va, "_flash_capable", lambda device: branch != "dense-pre-ampere")
    loss, grads = _loss_and_grads(model, batch)
    layers = SIZES["num_hidden_layers"]
    documents = [0, 10, 19, 24, 41, 48]  # every layer, the same documents: 10+9+5 and 17+7 tokens
    in_layers = [c for c in calls if c[0] == documents]
    if branch == "kernel":
        assert in_layers == [(documents, SIZES["num_key_value_heads"])] * layers
    elif branch == "kernel-same-heads":
        assert in_layers == [(documents, SIZES["num_attention_heads"])] * layers
    else:  # (prime's probe of the kernel may have run: not in a layer)
        assert in_layers == []
    assert loss == pytest.approx(want_loss, rel=1e-6)
    for name, g in grads.items():
        torch.testing.assert_close(g, want_grads[name], rtol=1e-5, atol=1e-6, msg=name)


def _tiled_heads(q, k, v, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
    """A kernel that pairs query head h with key/value head h % Hkv, not h // (H/Hkv)."""
    rep = q.shape[1] // k.shape[1]
    return _per_document_reference(q, k.repeat(1, rep, 1), v.repeat(1, rep, 1), *args, **kwargs)


def _with_enable_gqa(q, k, v, *args, enable_gqa: bool = False, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
    raise AssertionError("a kernel that names enable_gqa is taken at its word, not run")


@pytest.mark.parametrize(
    ("kernel", "native"),
    [(_per_document_reference, True), (_same_heads_only, False), (_tiled_heads, False)],
)
def test_grouped_heads_go_as_they_are_only_where_the_kernel_computes_them(
    kernel, native: bool, monkeypatch: pytest.MonkeyPatch
) -> None:  # noqa: ANN001
    """``prime`` finds out once per device whether the kernel takes fewer key/value heads: by
    name (``enable_gqa``, torch >= 2.13), else by comparing a small problem's output and input
    gradients with the heads repeated. A kernel that refuses them, or groups them otherwise
    than repeat_interleave does, gets them repeated."""
    cpu = torch.device("cpu")
    monkeypatch.setattr(va, "_GQA", {})
    monkeypatch.setattr(va, "_flash_capable", lambda device: True)
    monkeypatch.setattr(va, "_varlen", lambda: kernel)
    with torch.no_grad():  # as in an evaluation's forward
        va.prime(cpu)
    assert {cpu: native} == va._GQA
    monkeypatch.setattr(va, "_GQA", {})
    with torch.inference_mode():  # a first forward in inference mode finds the same
        va.prime(cpu)
    assert {cpu: native} == va._GQA
    monkeypatch.setattr(va, "_GQA", {})
    monkeypatch.setattr(va, "_varlen", lambda: _with_enable_gqa)
    va.prime(cpu)
    assert {cpu: True} == va._GQA
    # before Ampere the kernel does not run at all (the dense fallback does): nothing to probe
    monkeypatch.setattr(va, "_GQA", {})
    monkeypatch.setattr(va, "_flash_capable", lambda device: False)
    monkeypatch.setattr(va, "_varlen", lambda: _same_heads_only)
    monkeypatch.setattr(va, "_gqa_native", lambda fn, device: pytest.fail("probed"))
    va.prime(cpu)
    assert {cpu: False} == va._GQA


def test_bounds_computed_on_the_host_are_used_as_given(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The trainer computes the documents' bounds from the batch on the host and passes them as
    ``documents``: neither the adapter nor transformers (which looks for packed documents in the
    positions unless given a prepared mask) derives anything from the device positions. Each took
    a device sync per micro-batch: 27-30% of the forward thread's time on an H100 at 8B QLoRA.
    The loss and gradients are those of the bounds computed in forward."""
    folder, reference = _saved(tmp_path, "llama")
    model = _ours(folder, reference)
    batch = _packed_batch()
    monkeypatch.setattr(va, "runs_varlen", lambda device: True)
    monkeypatch.setattr(hf_head, "runs_varlen", lambda device: True)
    monkeypatch.setattr(va, "_varlen", lambda: _per_document_reference)
    monkeypatch.setattr(va, "HALF", (torch.float32,))
    monkeypatch.setattr(va, "_flash_capable", lambda device: True)
    want_loss, want_grads = _loss_and_grads(model, batch)
    documents = doc_attention.document_bounds(batch[2])
    assert documents.tolist() == [0, 10, 19, 24, 41, 48]

    def no_device_bounds(positions: torch.Tensor) -> torch.Tensor:
        raise AssertionError("bounds derived in forward although the caller gave them")

    monkeypatch.setattr(va, "document_bounds", no_device_bounds)
    from transformers import masking_utils

    monkeypatch.setattr(masking_utils, "find_packed_sequence_indices", no_device_bounds)
    # as given, and padded with empty documents at the end as the trainer passes them
    for given in (documents, doc_attention.document_bounds(batch[2], 16)):
        model.zero_grad(set_to_none=True)
        loss = model(*batch, documents=given)
        loss.backward()
        assert loss.item() == pytest.approx(want_loss, rel=1e-6)
        for name, p in model.named_parameters():
            torch.testing.assert_close(p.grad, want_grads[name], rtol=1e-5, atol=1e-6, msg=name)


def test_a_config_switched_to_another_attention_is_followed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """transformers keeps the attention implementation on the config object, and a model built
    from the same config with another one (``from_config(cfg, attn_implementation="sdpa")``)
    switches it for every model sharing it. The adapter must follow the config as it is at each
    call: passing the documents and the 4-D placeholder mask to SDPA would attend across the whole
    row, causal mask included (on an H100, a two-model test's gradients came out 111-159% off:
    docs/benchmarks/data/2026-12-07-varlen-shared-config-h100)."""
    folder, reference = _saved(tmp_path, "llama")
    model = _ours(folder, reference)
    batch = _packed_batch()
    want_loss, want_grads = _loss_and_grads(model, batch)  # CPU: transformers' mask + SDPA
    transformers.AutoModelForCausalLM.from_config(model.hf.config, attn_implementation="sdpa")
    assert model.hf.config._attn_implementation == "sdpa" and not model.varlen
    monkeypatch.setattr(va, "runs_varlen", lambda device: True)
    monkeypatch.setattr(hf_head, "runs_varlen", lambda device: True)
    loss, grads = _loss_and_grads(model, batch)
    assert loss == pytest.approx(want_loss, rel=1e-6)
    for name, g in grads.items():
        torch.testing.assert_close(g, want_grads[name], rtol=1e-5, atol=1e-6, msg=name)


def test_cuda_branch_without_bounds_refuses(monkeypatch: pytest.MonkeyPatch) -> None:
    """Called on the varlen device without the bounds (not through HFCausalLM), it must not fall
    back to plain causal attention across documents."""
    monkeypatch.setattr(va, "runs_varlen", lambda device: True)
    q = torch.randn(1, 2, 4, 8)
    with pytest.raises(RuntimeError, match="zerofit_cu_seqlens"):
        va.varlen_attention(torch.nn.Module(), q, q, q, None)


def test_doc_bounds_follow_transformers_packing_rule() -> None:
    from transformers.masking_utils import find_packed_sequence_indices

    gen = torch.Generator().manual_seed(0)
    rows = []
    for _ in range(6):
        row: list[int] = []
        while len(row) < 40:
            start = int(torch.randint(0, 3, (1,), generator=gen))  # not always from 0
            row += list(range(start, start + int(torch.randint(1, 12, (1,), generator=gen))))
        rows.append(row[:40])
    positions = torch.tensor(rows)
    cu, longest = va.doc_bounds(positions, 6, 40, positions.device)
    assert longest == 40 and cu.dtype == torch.int32
    theirs = find_packed_sequence_indices(positions)  # document index within each row
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), (theirs[:, -1] + 1).cumsum(0)[:-1]])
    want = (theirs + offsets[:, None]).flatten()
    ours = torch.searchsorted(cu[1:].long(), torch.arange(240), right=True)
    assert torch.equal(ours, want)
    assert va.doc_bounds(None, 3, 5, torch.device("cpu"))[0].tolist() == [0, 5, 10, 15]


def test_padded_bounds_are_one_shape_and_the_same_documents() -> None:
    """Bounds padded to a multiple (empty documents at the end): one length for batches with
    different counts of documents, and the same dense mask as the bounds unpadded."""
    _, _, positions = _packed_batch()
    plain = doc_attention.document_bounds(positions)
    padded = doc_attention.document_bounds(positions, 16)
    assert padded.numel() == 16 and padded.dtype == torch.int32
    assert torch.equal(padded[: plain.numel()], plain)
    assert padded[plain.numel() :].tolist() == [positions.numel()] * (16 - plain.numel())
    fewer = doc_attention.document_bounds(torch.arange(24).repeat(2, 1), 16)
    assert fewer.tolist() == [0, 24] + [48] * 14  # two documents: the same length
    assert torch.equal(va._dense_mask(padded, 2, 24), va._dense_mask(plain, 2, 24))
    exact = doc_attention.document_bounds(torch.arange(24).repeat(2, 1), 3)
    assert exact.tolist() == [0, 24, 48]  # already a multiple: nothing added


def test_dense_mask_equals_transformers_packed_mask() -> None:
    from transformers.masking_utils import create_causal_mask

    _, _, positions = _packed_batch()
    config = transformers.LlamaConfig(**SIZES)
    config._attn_implementation = "sdpa"
    embeds = torch.zeros(2, 24, SIZES["hidden_size"])
    theirs = create_causal_mask(config, embeds, None, None, position_ids=positions)
    cu, _ = va.doc_bounds(positions, 2, 24, positions.device)
    assert torch.equal(va._dense_mask(cu, 2, 24), theirs)


@pytest.mark.parametrize(
    ("family", "refused"),
    [("llama", None), ("qwen3", None), ("gemma", None), ("phi3", None), ("qwen2", None),
     ("mistral", "sliding-window"), ("gemma2", "is not one of"), ("cohere", "is not one of")],
)  # fmt: skip
def test_only_plain_causal_attention_uses_it(family: str, refused: str | None) -> None:
    config = CONFIGS[family][0]()
    reason = va.varlen_refusal(config)
    assert (reason is None) if refused is None else (refused in reason), reason
    mistral = transformers.MistralConfig(**SIZES, sliding_window=None)
    assert va.varlen_refusal(mistral) is None
    soft = transformers.LlamaConfig(**SIZES)
    soft.attn_logit_softcapping = 30.0
    assert "soft-caps" in va.varlen_refusal(soft)
    dropout = transformers.LlamaConfig(**SIZES, attention_dropout=0.1)
    assert "dropout" in va.varlen_refusal(dropout)


def test_refused_models_keep_transformers_attention(tmp_path: Path) -> None:
    folder, _ = _saved(tmp_path, "mistral")  # sliding window 8
    spec = build_model(hf=str(folder))
    assert not spec.module.varlen
    assert spec.module.hf.config._attn_implementation != va.NAME
