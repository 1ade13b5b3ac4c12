"""The positional toy's naive-loss gradient, fused: one pass, no autograd, for one run or R.

The toy's step is a few dozen tiny tensor operations, so its time is their per-call
overhead (1-3 us each on a CPU core), not arithmetic. ``NaiveBatch`` holds what an epoch's
inner steps share, computed once at its first: the distinct prompts, each sampled token's
index in the log-softmax, the loss's gradient on every log-prob (w * -delta summed per
prompt, position and token; the naive loss is linear in the log-probs) and its sum per
position. ``naive_gradients`` then takes one inner step's forward pass, loss, entropy and
backward pass (``backward_pass``, by hand) in about thirty calls.

The numbers are the autograd path's, bit for bit (``rlvr.loop.step.accumulate_gradients`` with
``policy.log_probs``; tests/test_toy_learner.py): the same operations on the same operands
in the same order, only the constant ones hoisted out of the inner steps. With a run axis R,
each run's are those of the run alone (``rlvr.loop.batched``; tests/test_batched.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rlvr.policies.positional import (
    Buffers,
    backward_pass,
    chosen_index,
    consecutive_groups,
    forward_pass,
    log_softmax_backward,
    tempered_log_softmax,
)


@dataclass
class NaiveBatch:
    """An epoch's batch as the naive loss's inner steps use it (R: an optional run axis).

    prompts [U, n] distinct prompts; row_prompt [N] each response's; chosen [*R, N, n] each
    token's flat index into the [*R, U*n, V] log-softmax; neg_deltas [*R, N, 1] -delta;
    weights [N, n] the aggregation weights (the same for every run) and whether all are
    positive (else the loss leaves the others out, as ``core.weighted_sum``); grad_log_probs
    [*R, U*n, V] d loss / d log-softmax and grad_sums [*R, U*n, 1] its sums over the
    vocabulary; policy_mask [N, n], whether it is all set, and tokens, its count."""

    prompts: torch.Tensor
    row_prompt: torch.Tensor
    chosen: torch.Tensor
    neg_deltas: torch.Tensor
    weights: torch.Tensor
    all_weighted: bool
    grad_log_probs: torch.Tensor
    grad_sums: torch.Tensor
    policy_mask: torch.Tensor
    all_policy: bool
    tokens: torch.Tensor


def naive_batch(prompt_ids: torch.Tensor, responses: torch.Tensor, deltas: torch.Tensor, weights: torch.Tensor,
                policy_mask: torch.Tensor, vocab: int) -> NaiveBatch:
    """prompt_ids [N, n] each response's prompt (a group's rows consecutive), responses
    [*R, N, n], deltas [*R, N], weights and policy_mask [N, n] -> the batch's constants."""
    prompts, row_prompt = consecutive_groups(prompt_ids)
    u, n = prompts.shape
    chosen = chosen_index(row_prompt, responses, u, vocab)  # [*R, N, n]
    neg_deltas = -deltas.unsqueeze(-1)  # [*R, N, 1]
    runs = responses.shape[:-2]
    # autograd's gradient on each chosen log-prob: d sum(w * pg) / d pg = w, times d pg / d log pi = -delta
    grad_log_probs = torch.zeros(*runs, u * n, vocab, dtype=weights.dtype)
    grad_log_probs.view(-1).scatter_add_(0, chosen.reshape(-1), (weights * neg_deltas).reshape(-1))
    return NaiveBatch(prompts, row_prompt, chosen, neg_deltas, weights, bool((weights > 0).all()), grad_log_probs,
                      grad_log_probs.sum(dim=-1, keepdim=True), policy_mask, bool(policy_mask.all()),
                      policy_mask.sum())


@torch.no_grad()
def naive_gradients(embedding: torch.Tensor, encode: torch.Tensor, decode: torch.Tensor, batch: NaiveBatch,
                    temperature: float, with_entropy: bool, grads: dict[str, torch.Tensor] | None = None,
                    buffers: Buffers | None = None) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """One inner step of the naive loss sum(w * -delta * log pi) on weights embedding
    [*R, V, D], encode and decode [*R, n, D, D]: their gradients (written into ``grads``
    where given) and the step's sums as ``rlvr.loop.step.step_sums`` makes them, each [*R].
    ``buffers``: where the passes' tensors live (a ``Workspace`` kept between inner steps)."""
    runs = embedding.shape[:-2]
    u, n = batch.prompts.shape
    activations = forward_pass(embedding, encode, decode, batch.prompts, buffers)
    all_log_probs = tempered_log_softmax(activations.logits, temperature)  # [*R, U*n, V]
    probs = all_log_probs.exp()
    weighted = batch.neg_deltas * all_log_probs.take(batch.chosen) * batch.weights  # [*R, N, n]
    if not batch.all_weighted:
        weighted = torch.where(batch.weights > 0, weighted, 0.0)
    loss = _sum(weighted, runs)
    zeros = loss.new_zeros(runs)
    sums = {"loss": loss, "pg_loss": loss, "kl": zeros, "clip_frac": zeros, "tokens": batch.tokens}
    if with_entropy:
        distinct = -(probs * all_log_probs).sum(dim=-1).view(*runs, u, n)  # [*R, U, n]
        entropy = distinct.index_select(-2, batch.row_prompt)  # [*R, N, n]
        if not batch.all_policy:
            entropy = torch.where(batch.policy_mask, entropy, 0.0)
        sums["entropy"] = _sum(entropy, runs)
    grad_logits = log_softmax_backward(batch.grad_log_probs, probs, temperature, grad_sums=batch.grad_sums,
                                       buffers=buffers)
    return backward_pass(activations, embedding, batch.prompts, grad_logits, grads=grads, buffers=buffers), sums


def _sum(x: torch.Tensor, runs: tuple[int, ...]) -> torch.Tensor:
    """Each run's sum of x [*R, N, n]: the whole tensor's for one run."""
    return x.sum(dim=(1, 2)) if runs else x.sum()
