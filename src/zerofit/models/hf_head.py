"""The adapter around a Hugging Face causal LM: ``forward(tokens, targets=None, positions=None)``.

With a fused head, the adapter runs the HF decoder (``base_model``) to the last hidden states and
then the model's own output layer, whose class is swapped in place to ``LMHead`` (an ``nn.Linear``
that also takes the targets): the output layer and the loss then go chunk by chunk through
``zerofit.models.loss.linear_cross_entropy``, never holding all the logits. The head stays the same
module with the same parameter (a tied embedding stays tied), so FSDP2 and DeepSpeed ZeRO-3 see
it, and their module hooks fire, as before. Where the architecture transforms the logits
(``zerofit.models.shape.hf_head_fallback``) or the model has no plain head, the HF model runs whole
and the loss is taken on its full logits.

``positions`` [B, T] (restarting at 0 at each packed document) go to HF as ``position_ids``. With
no attention mask and no cache, transformers' ``masking_utils`` splits a row into documents where
the positions do not step by one and masks block-diagonally (sdpa, eager, flex; flash attention
takes the same cue): each token sees only the earlier tokens of its own document. Where the
model runs ``zerofit_varlen`` (``zerofit.models.hf_attention``), every layer runs FlashAttention
varlen on the documents' bounds, which the trainer computes on the host from the batch before it
moves (``documents``: no device sync), else the adapter once per forward on CUDA.
"""

from __future__ import annotations

import torch
from torch import nn

from zerofit.models.hf_attention import (
    CU_KEY,
    MAX_KEY,
    doc_bounds,
    prepared_mask,
    prime,
    runs_varlen,
)
from zerofit.models.hf_attention import NAME as VARLEN
from zerofit.models.loss import LMHead, cross_entropy, token_cross_entropy


def head_structure_fallback(model: nn.Module) -> str | None:
    """Why ``model`` (an HF causal LM) cannot run as decoder + plain head, or None if it can."""
    head = model.get_output_embeddings()
    if type(head) is not nn.Linear:
        return f"its output layer is a {type(head).__name__}, not a plain Linear"
    if head.bias is not None:
        return "its output layer has a bias"
    base = getattr(model, "base_model", model)
    if base is model:
        return "no base model (decoder) to run before the output layer"
    return None


class HFCausalLM(nn.Module):
    """Adapter over an HF causal LM in ``self.hf``: logits, or the mean loss given targets (each
    token's, ``per_token=True``).

    ``fused``: run the decoder, then the output layer + loss in chunks of ``loss_chunk`` tokens
    (the head must pass ``head_structure_fallback``). Otherwise the whole HF model gives logits.
    """

    def __init__(self, model: nn.Module, loss_chunk: int = 0, fused: bool = False) -> None:
        super().__init__()
        self.hf = model
        self.fused = fused
        if fused:
            head = model.get_output_embeddings()
            head.__class__ = LMHead  # same module, parameters and hooks; forward(h, targets)
            head.loss_chunk = loss_chunk

    @property
    def varlen(self) -> bool:
        """Whether the model runs ``zerofit_varlen``, read from its config at each call, as
        transformers reads it: the choice lives on the config object, which a model built from
        the same config with another attention (``from_config(cfg, attn_implementation=...)``)
        switches for every model sharing it."""
        return getattr(self.hf.config, "_attn_implementation", None) == VARLEN

    def forward(
        self,
        tokens: torch.Tensor,
        targets: torch.Tensor | None = None,
        positions: torch.Tensor | None = None,
        documents: torch.Tensor | None = None,
        per_token: bool = False,
    ) -> torch.Tensor:
        """tokens [B, T] -> logits [B, T, V]; with targets [B, T] (-100: no loss), the mean loss;
        with ``per_token`` too, each place's loss [B, T] in fp32 (0 where the target is -100).

        positions [B, T] or None (plain causal attention over the whole row); documents: their
        bounds as ``zerofit.models.doc_attention.document_bounds`` gives them, computed on the
        host by the caller (else here, at the cost of a device sync)."""
        if per_token and targets is None:
            raise ValueError("per_token=True needs the targets")
        extra = self._doc_kwargs(tokens, positions, documents)
        if not self.fused:
            logits = self.hf(input_ids=tokens, position_ids=positions, use_cache=False, **extra)
            logits = logits.logits
            if targets is None:
                return logits
            loss = token_cross_entropy if per_token else cross_entropy
            return loss(logits, targets)
        out = self.hf.base_model(input_ids=tokens, position_ids=positions, use_cache=False, **extra)
        hidden = out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]
        return self.hf.get_output_embeddings()(hidden, targets, per_token=per_token)

    def _doc_kwargs(
        self, tokens: torch.Tensor, positions: torch.Tensor | None, documents: torch.Tensor | None
    ) -> dict:
        """With ``zerofit_varlen`` on CUDA: the documents' bounds, computed once for every layer."""
        if not (self.varlen and runs_varlen(tokens.device)):
            return {}
        prime(tokens.device)
        b, t = tokens.shape
        cu, longest = doc_bounds(positions, b, t, tokens.device, documents)
        return {CU_KEY: cu, MAX_KEY: longest, "attention_mask": prepared_mask(tokens.device)}
