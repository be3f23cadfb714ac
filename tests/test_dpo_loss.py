"""DPO's arithmetic (`zerofit.train.preference`) against hand-written loops and formulas, and, where
TRL is installed, against TRL's own DPO trainer on the same tiny batch and model."""

from __future__ import annotations

import copy
import math
from pathlib import Path

import pytest
import torch

from zerofit.models import build_model
from zerofit.models.loss import IGNORE_INDEX
from zerofit.train.preference import METRICS, dpo_loss, dpo_metrics, metric_means, pair_logps


def _pairs_case() -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token losses [3, 10] and pair places: pairs 2, 5 and 9 (sparse, unordered), pair 5's
    responses in two rows, pair 9 without a rejected response."""
    gen = torch.Generator().manual_seed(0)
    nll = torch.rand(3, 10, generator=gen, dtype=torch.float64).requires_grad_()
    pairs = torch.zeros(3, 10, dtype=torch.long)
    pairs[0, 2:4], pairs[0, 5:8] = 6, -6  # pair 5 in row 0 ...
    pairs[1, 1:3], pairs[1, 4:6] = -3, 3  # pair 2: rejected first
    pairs[1, 8:] = -6  # ... and more of pair 5's rejected response in row 1
    pairs[2, 0:4] = 10  # pair 9: chosen only
    return nll, pairs


def _pair_logps_by_hand(
    nll: torch.Tensor, pairs: torch.Tensor
) -> tuple[list[int], list[torch.Tensor], list[torch.Tensor]]:
    ids = sorted({abs(int(v)) - 1 for v in pairs.flatten() if v != 0})
    chosen, rejected = [], []
    for g in ids:
        c, r = nll.new_zeros(()), nll.new_zeros(())
        for b in range(pairs.shape[0]):
            for t in range(pairs.shape[1]):
                if pairs[b, t] == g + 1:
                    c = c - nll[b, t]
                elif pairs[b, t] == -(g + 1):
                    r = r - nll[b, t]
        chosen.append(c)
        rejected.append(r)
    return ids, chosen, rejected


def test_pair_logps_matches_a_loop() -> None:
    """Sorted pair ids, each response's summed log-probability, and the gradients, as a loop."""
    nll, pairs = _pairs_case()
    ids, chosen, rejected = pair_logps(nll, pairs)
    want_ids, want_c, want_r = _pair_logps_by_hand(nll, pairs)
    assert ids.tolist() == want_ids == [2, 5, 9]
    torch.testing.assert_close(chosen, torch.stack(want_c))
    torch.testing.assert_close(rejected, torch.stack(want_r))
    assert rejected[2].item() == 0.0  # pair 9 has no rejected response here
    weights = torch.randn(2, 3, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    (torch.stack([chosen, rejected]) * weights).sum().backward()
    got = nll.grad.clone()
    nll.grad = None
    (torch.stack([torch.stack(want_c), torch.stack(want_r)]) * weights).sum().backward()
    torch.testing.assert_close(got, nll.grad)
    assert torch.all(got[pairs == 0] == 0)


def test_pair_logps_edges() -> None:
    """No pair in the batch: empty results; shapes that differ: an error."""
    nll = torch.rand(2, 4)
    ids, chosen, rejected = pair_logps(nll, torch.zeros(2, 4, dtype=torch.long))
    assert ids.numel() == chosen.numel() == rejected.numel() == 0
    with pytest.raises(ValueError, match="differ"):
        pair_logps(nll, torch.zeros(2, 5, dtype=torch.long))


def _logps(n: int = 6, seed: int = 0) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [
        (-20 * torch.rand(n, generator=gen, dtype=torch.float64)).requires_grad_() for _ in "abcd"
    ]


@pytest.mark.parametrize("label_smoothing", [0.0, 0.1, 0.3])
@pytest.mark.parametrize("beta", [0.1, 0.5])
def test_dpo_loss_matches_the_formula(beta: float, label_smoothing: float) -> None:
    """Loss, rewards and gradients as the formula writes them; the reference takes no gradient."""
    pc, pr, rc, rr = _logps()
    losses, r_chosen, r_rejected = dpo_loss(pc, pr, rc, rr, beta, label_smoothing)
    u = beta * ((pc - rc.detach()) - (pr - rr.detach()))
    ls = label_smoothing
    want = -(1 - ls) * torch.log(torch.sigmoid(u)) - ls * torch.log(torch.sigmoid(-u))
    torch.testing.assert_close(losses, want)
    torch.testing.assert_close(r_chosen, (beta * (pc - rc)).detach())
    torch.testing.assert_close(r_rejected, (beta * (pr - rr)).detach())
    assert not r_chosen.requires_grad and not r_rejected.requires_grad
    weights = torch.rand(6, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    got = torch.autograd.grad((losses * weights).sum(), [pc, pr], retain_graph=True)
    want_grads = torch.autograd.grad((want * weights).sum(), [pc, pr])
    for g, w in zip(got, want_grads, strict=True):
        torch.testing.assert_close(g, w)
    (losses.sum()).backward()
    assert rc.grad is None and rr.grad is None


@pytest.mark.parametrize("beta", [0.01, 0.1, 1.0, 7.5])
def test_policy_equal_to_reference_gives_ln2(beta: float) -> None:
    """Before the first update (policy == reference) every pair's loss is ln 2, whatever beta."""
    pc, pr, _, _ = _logps()
    losses, r_chosen, r_rejected = dpo_loss(pc, pr, pc.detach(), pr.detach(), beta, 0.0)
    assert torch.all(losses == torch.tensor(math.log(2), dtype=losses.dtype))
    assert torch.all(r_chosen == 0) and torch.all(r_rejected == 0)
    smoothed = dpo_loss(pc, pr, pc.detach(), pr.detach(), beta, 0.2)[0]
    torch.testing.assert_close(smoothed, losses, rtol=1e-15, atol=0)


def test_label_smoothing_is_a_share_of_flipped_pairs() -> None:
    """cDPO: with smoothing ls, the loss is (1 - ls) x the pair's loss + ls x the loss of the pair
    with chosen and rejected swapped."""
    pc, pr, rc, rr = _logps(seed=3)
    ls = 0.25
    mixed = dpo_loss(pc, pr, rc, rr, 0.2, ls)[0]
    plain = dpo_loss(pc, pr, rc, rr, 0.2, 0.0)[0]
    flipped = dpo_loss(pr, pc, rr, rc, 0.2, 0.0)[0]
    torch.testing.assert_close(mixed, (1 - ls) * plain + ls * flipped)
    assert not torch.allclose(mixed, plain)


def test_model_to_loss_is_ln2_before_the_first_update() -> None:
    """zerofit's Llama, packed rows of pairs: the policy's per-token losses (with gradients) and the
    same model's under no_grad (a reference identical to the policy) give exactly ln 2 per pair,
    and each pair's loss moves its own responses' log-probabilities only."""
    from zerofit.distributed.parallelize import materialize_  # the test's model only

    spec = build_model(preset="tiny", overrides={"n_layers": 2, "dim": 64}, loss_chunk=16)
    materialize_(spec.module, torch.device("cpu"), init_seed=0, init_param_=spec.init_param_)
    gen = torch.Generator().manual_seed(4)
    tokens = torch.randint(0, 512, (2, 48), generator=gen)
    targets = torch.randint(0, 512, (2, 48), generator=gen)
    positions = torch.cat([torch.arange(30), torch.arange(18)]).repeat(2, 1)
    pairs = torch.zeros(2, 48, dtype=torch.long)
    pairs[0, 10:20], pairs[0, 20:29] = 1, -1  # pair 0: prompt 0-9, chosen, rejected
    pairs[0, 35:40], pairs[0, 40:47] = 4, -4
    pairs[1, 5:29] = 3  # pair 2: its rejected response in the other row
    pairs[1, 33:47] = -3
    targets[pairs == 0] = IGNORE_INDEX
    nll = spec.module(tokens, targets, positions=positions, per_token=True)
    with torch.no_grad():
        ref_nll = spec.module(tokens, targets, positions=positions, per_token=True)
    ids, chosen, rejected = pair_logps(nll, pairs)
    _, ref_chosen, ref_rejected = pair_logps(ref_nll, pairs)
    losses = dpo_loss(chosen, rejected, ref_chosen, ref_rejected, beta=0.1)[0]
    assert ids.tolist() == [0, 2, 3]
    assert torch.all(losses == torch.tensor(math.log(2)))
    nll.retain_grad()
    losses[0].backward()
    # d loss / d logp = -beta/2 on the chosen, +beta/2 on the rejected; logp = -sum nll
    want = torch.zeros(2, 48)
    want[pairs == 1], want[pairs == -1] = 0.05, -0.05
    torch.testing.assert_close(nll.grad, want)


def test_metrics_sum_over_micro_batches_to_the_whole_batch() -> None:
    """Sums of two halves give the means of the whole: margin, accuracy, log-probs, rewards."""
    pc, pr, rc, rr = (t.detach() for t in _logps(n=8, seed=5))
    _, r_chosen, r_rejected = dpo_loss(pc, pr, rc, rr, 0.1)
    halves = [slice(0, 3), slice(3, 8)]
    sums = sum(dpo_metrics(pc[s], pr[s], r_chosen[s], r_rejected[s]) for s in halves)
    assert sums.shape == (len(METRICS),) and sums.dtype == torch.float64
    got = metric_means(sums)
    margin = r_chosen - r_rejected
    want = {
        "pairs": 8.0,
        "margin": margin.mean().item(),
        "accuracy": (margin > 0).double().mean().item(),
        "logp_chosen": pc.mean().item(),
        "logp_rejected": pr.mean().item(),
        "reward_chosen": r_chosen.mean().item(),
        "reward_rejected": r_rejected.mean().item(),
    }
    assert 0 < want["accuracy"] < 1
    assert got == pytest.approx(want, rel=1e-12)
    assert metric_means(torch.zeros(len(METRICS)))["margin"] == 0.0  # no pairs: no division by 0


# ----------------------------------------------------------------------------------- against TRL


def _trl_trainer(tmp_path: Path, beta: float):  # noqa: ANN202
    """TRL's DPOTrainer over a tiny random Llama (policy a perturbed copy of the reference), with a
    word-level tokenizer built here (nothing downloaded); and zerofit's copies of both models."""
    transformers = pytest.importorskip("transformers")
    trl = pytest.importorskip("trl")
    datasets = pytest.importorskip("datasets")
    from tokenizers import Tokenizer, models, pre_tokenizers  # transformers' own dependency

    from zerofit.models.hf_head import HFCausalLM  # transformers only past the skip

    words = Tokenizer(models.WordLevel({f"t{i}": i for i in range(64)}, unk_token="t1"))
    words.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=words, pad_token="t0", eos_token="t2"
    )
    config = transformers.LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2,
    )  # fmt: skip
    torch.manual_seed(0)
    reference = transformers.LlamaForCausalLM(config)
    policy = copy.deepcopy(reference)
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(0.05 * torch.randn_like(p))
    ours = HFCausalLM(copy.deepcopy(policy), loss_chunk=4, fused=True)
    ours_ref = HFCausalLM(copy.deepcopy(reference), loss_chunk=4, fused=True)
    data = datasets.Dataset.from_list([{"prompt": "t3 t4", "chosen": " t5", "rejected": " t6"}])
    # fp32 throughout: TRL's configs default to bf16, which autocasts the reference model
    args = trl.DPOConfig(
        output_dir=str(tmp_path), beta=beta, report_to=[], use_cpu=True, bf16=False
    )
    trainer = trl.DPOTrainer(
        model=policy, ref_model=reference, args=args, train_dataset=data, processing_class=tokenizer
    )
    return trainer, ours, ours_ref


def test_matches_trl_dpo_sigmoid_loss(tmp_path: Path) -> None:
    """The same tiny batch of 3 pairs through TRL's DPOTrainer (loss_type sigmoid) and through
    zerofit (the adapter's per-token losses, pair_logps, dpo_loss): the same loss within 1e-5 and
    the same policy gradients. TRL's batch puts a pair's chosen and rejected rows apart.
    (TRL >= 1.0 applies no label smoothing to its sigmoid loss: it is compared at 0.)"""
    trainer, ours, ours_ref = _trl_trainer(tmp_path, beta=0.3)
    examples = [
        {"prompt_ids": [3, 4, 5], "chosen_ids": [6, 7], "rejected_ids": [8]},
        {"prompt_ids": [9, 10], "chosen_ids": [11], "rejected_ids": [12, 13, 14]},
        {"prompt_ids": [15], "chosen_ids": [16, 17, 18, 2], "rejected_ids": [19, 2]},
    ]
    batch = trainer.data_collator(examples)
    trainer.model.train()
    want = trainer.compute_loss(trainer.model, batch)
    want.backward()
    # zerofit's rows: the same tokens; a target is the next token where that one is a response's
    tokens, scored = batch["input_ids"], batch["completion_mask"][:, 1:] == 1
    targets = torch.full_like(tokens, IGNORE_INDEX)
    targets[:, :-1] = torch.where(scored, tokens[:, 1:], IGNORE_INDEX)
    n = len(examples)
    ids = torch.cat([torch.arange(1, n + 1), -torch.arange(1, n + 1)])[:, None]
    pairs = torch.zeros_like(tokens)
    pairs[:, :-1] = torch.where(scored, ids, 0)
    with torch.no_grad():
        _, ref_chosen, ref_rejected = pair_logps(ours_ref(tokens, targets, per_token=True), pairs)
    _, chosen, rejected = pair_logps(ours(tokens, targets, per_token=True), pairs)
    got = dpo_loss(chosen, rejected, ref_chosen, ref_rejected, 0.3)[0].mean()
    got.backward()
    print(f"zerofit {got.item():.9f}, TRL {want.item():.9f}")
    assert abs(got.item() - want.item()) <= 1e-5, (got.item(), want.item())
    theirs = dict(trainer.model.named_parameters())
    for name, p in ours.named_parameters():
        g = theirs[name.removeprefix("hf.")].grad
        torch.testing.assert_close(p.grad, g, rtol=1e-4, atol=1e-5 * g.abs().max().item())
