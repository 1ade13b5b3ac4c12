"""Several runs of the positional sorting toy as one batched computation.

``rlvr compare`` trains the same configuration with several seeds and delta modes. Each
run's step is a few dozen tiny tensor operations, so its time is per-operation overhead;
``train_batched`` gives every tensor a leading run axis R and takes all runs' steps in
one pass, with records equal to ``rlvr.loop.trainer.train`` run by run (``==`` on every
number but the ``time/*`` timings and ``tokens_per_sec_generate``; ``tests/test_batched.py``).

What is batched here and nothing more: the model's forward and backward
(``rlvr.policies.positional``, the same functions a run alone uses, over the run axis),
sampling, grading, the deltas and the naive loss's gradient. Each run keeps its own
TrainState; the functions a run alone uses make its records, given every run at once
(``rollout_stats``, ``step_metrics``, ``evaluate_runs`` sampling through ``BatchedPositional``).

What keeps the numbers bit for bit:
  * random draws: each run keeps its own ``torch.Generator``; the multinomial draws are
    one call per run on that run's rows of the batched probabilities (cheap), the math
    around them is batched.
  * matmuls: aligned operands and the way ``matmul_way`` found exact (run_matmul.py);
    ``BatchedPositional.inexact_matmul`` refuses, before any work, a machine where no way is.
  * the optimizer: one optimizer (``build_optimizer``) over every run's parameters as
    separate tensors. One Adam over ``[R, ...]`` tensors is NOT the same: the fused CPU
    kernel takes each tensor's last ``numel % 16`` elements through a scalar loop in
    double precision and the rest through float32 vectors, so which elements are in the
    tail depends on the tensor's size (1e-8 differences; ``test_one_adam_over_stacked``).
  * reductions (sums, norms, means over a run's rows) and the row-wise softmax give the
    same bits batched as alone (tested).

Shapes: R runs, B prompts, U distinct consecutive prompts, G group size, N = B*G
responses, n numbers per prompt (= response length T), D embedding size, V vocab.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from rlvr import core
from rlvr.base.errors import ConfigError
from rlvr.base.interfaces import Task
from rlvr.base.record import Record
from rlvr.config import Config
from rlvr.loop.diagnostics import max_reward_stats, prompt_solve_shares
from rlvr.loop.evaluation import evaluate_runs
from rlvr.loop.optim import build_optimizer, build_scheduler, optimizer_update
from rlvr.loop.seams import TOY_STEP_ALGO, as_override, toy_step_needs
from rlvr.loop.state import TrainState
from rlvr.loop.step import skip_step, step_metrics
from rlvr.loop.trainer import rollout_stats, setup
from rlvr.policies.positional import (
    Activations,
    Workspace,
    backward_pass,
    consecutive_groups,
    forward_pass,
    log_softmax_backward,
    sample_tokens,
    tempered_log_softmax,
)
from rlvr.policies.positional_step import NaiveBatch, naive_batch, naive_gradients
from rlvr.policies.run_matmul import InexactMatmul, aligned_copy, aligned_empty

DIFFERING_FIELDS = ("name", "out_dir", "seed", "algo.deltas")  # what runs of one batch may differ in
TIMING_KEYS = ("time/generate", "time/reward", "time/score", "time/step", "tokens_per_sec_generate")

ANY_VALUE = "any value"
# Every algo.* field, and what the batched path does with it: ANY_VALUE, it trains as the
# trainer does (or the field is read only by options refused here); any other value is
# the only one batched (the fused step's, ``TOY_STEP_ALGO``, and the collection's), other
# values are refused. A new field fails tests/test_batched.py until it is declared here.
BATCHED_ALGO: dict[str, Any] = {
    "preset": ANY_VALUE,  # resolved into the fields below when the config loads
    "epochs": ANY_VALUE,
    "inner_steps": ANY_VALUE,
    "group_size": ANY_VALUE,
    "deltas": ANY_VALUE,
    "aggregation": ANY_VALUE,
    "normalizer": ANY_VALUE,
    "adv_eps": ANY_VALUE,
    "clip_eps": ANY_VALUE,  # the clipped losses'
    "clip_eps_high": ANY_VALUE,
    "clip_ratio_c": ANY_VALUE,
    "old_log_probs": ANY_VALUE,  # the naive loss has no ratio
    "kl_estimator": ANY_VALUE,  # the KL's (kl_coef > 0)
    "ref_update_every": ANY_VALUE,
    "kl_in": ANY_VALUE,
    "is_low": ANY_VALUE, "is_high": ANY_VALUE,  # the sampler-mismatch correction's (none here)
    "dynamic_sampling": False,
    "max_sampling_tries": ANY_VALUE,  # dynamic sampling's
    "overlong": "none",
    "overlong_cache": ANY_VALUE,  # overlong's
    "overlong_factor": ANY_VALUE,
    **TOY_STEP_ALGO,
}
COLLECTION_ALGO = {name: value for name, value in BATCHED_ALGO.items()
                   if value != ANY_VALUE and name not in TOY_STEP_ALGO}


def batching_refusal(configs: Sequence[Config]) -> str | None:
    """Why ``configs`` cannot train as one batch (None: they can): what ``ToyLearner`` needs
    (``toy_step_needs``), the sorting task with fixed prompts, ``BATCHED_ALGO``'s values, no
    user rewards or Ray workers, all equal but in DIFFERING_FIELDS."""
    if not configs:
        return "no runs"
    c = configs[0]
    needs = {
        "task.name=sorting": c.task.name == "sorting",
        "fixed task.options.prompts (not null)": c.task.options.prompts is not None,
        "rewards.functions=[]": not c.rewards.functions,
        "cluster.rollout_workers=0": c.cluster.rollout_workers == 0,
    }
    missing = toy_step_needs(c) + [need for need, ok in needs.items() if not ok] + [
        f"algo.{name}={as_override(value)}" for name, value in COLLECTION_ALGO.items()
        if getattr(c.algo, name) != value]
    if missing:
        return f"batched runs need {', '.join(missing)}"

    def shared(config: Config) -> dict:
        d = config.to_dict()
        for field in DIFFERING_FIELDS:
            *path, last = field.split(".")
            section = d
            for key in path:
                section = section[key]
            section.pop(last)
        return d

    first = shared(c)
    for i, other in enumerate(configs[1:], start=1):
        if shared(other) != first:
            return (f"run {i} ({other.name}) differs from run 0 ({c.name}) in more than "
                    f"{', '.join(DIFFERING_FIELDS)}")
    return None


# ---------------------------------------------------------------- the runs' weights


class BatchedPositional:
    """The positional model's weights of R runs as aligned [R, ...] tensors, with their
    gradients; each run's module parameters become views of them (so a run's policy always
    holds its current weights: its evaluation, its checkpoint)."""

    NAMES = ("encode", "decode", "embedding")  # module.parameters() order

    def __init__(self, modules: Sequence[nn.Module]):
        self.embedding = aligned_copy(torch.stack([m.embedding.weight.detach() for m in modules]))  # [R, V, D]
        self.encode = aligned_copy(torch.stack([m.encode.detach() for m in modules]))  # [R, n, D, D]
        self.decode = aligned_copy(torch.stack([m.decode.detach() for m in modules]))  # [R, n, D, D]
        # contiguous: a batched matmul writes into them in one call (``matmul_way``)
        self.grads = {name: torch.empty(getattr(self, name).shape) for name in self.NAMES}
        self.params: list[list[nn.Parameter]] = []  # per run, in module.parameters() order
        for r, m in enumerate(modules):
            m.encode = nn.Parameter(self.encode[r])
            m.decode = nn.Parameter(self.decode[r])
            m.embedding.weight = nn.Parameter(self.embedding[r])
            self.params.append(list(m.parameters()))
        self.restore_grads(range(len(modules)))
        self.workspace = Workspace()  # the inner steps' tensors (``naive_gradients``), reused
        self.runs, self.length, self.vocab, self.dim = len(modules), self.encode.shape[1], *self.embedding.shape[1:]

    def restore_grads(self, runs: Sequence[int] | range) -> None:
        """Point these runs' ``.grad`` at their blocks of ``self.grads`` (a skipped step drops them)."""
        for r in runs:
            for name, p in zip(self.NAMES, self.params[r]):
                p.grad = self.grads[name][r]

    def inexact_matmul(self, rows: Sequence[int]) -> str | None:
        """The first matmul of a step's passes (``naive_gradients``: forward, backward into
        ``self.grads``' layout) or of a forward alone (sampling, evaluation) with no exact way on
        this machine, or None: ``rows``, the M of each pass. A trial on zero weights laid
        out as these; nothing of the model changes."""
        weights = [aligned_empty(*w.shape).zero_() for w in (self.embedding, self.encode, self.decode)]
        grads = {name: torch.empty_like(g) for name, g in self.grads.items()}
        try:
            for m in dict.fromkeys(rows):
                prompts = torch.zeros(m, self.length, dtype=torch.long)
                forward_pass(*weights, prompts)
                work = Workspace()
                acts = forward_pass(*weights, prompts, work)
                grad_logits = log_softmax_backward(acts.logits, acts.logits, 1.0, buffers=work)
                backward_pass(acts, weights[0], prompts, grad_logits, grads=grads, buffers=work)
        except InexactMatmul as err:
            return str(err)
        return None

    def forward(self, prompts: torch.Tensor) -> Activations:
        """prompts [M, n], shared by the runs -> Activations with logits [R, M*n, V]."""
        return forward_pass(self.embedding, self.encode, self.decode, prompts)

    @torch.no_grad()
    def draw(self, prompts: torch.Tensor, count: int, temperature: float, generators: Sequence[torch.Generator]
             ) -> torch.Tensor:
        """``PositionalPolicy.sample``'s responses of every run: prompts [M, n] -> [R, M, count, n],
        run r's drawn with ``generators[r]``."""
        probs = tempered_log_softmax(self.forward(prompts).logits, temperature).exp()  # [R, M*n, V]
        return torch.stack([sample_tokens(probs[r], prompts.shape[0], count, gen) for r, gen in enumerate(generators)])

    @torch.no_grad()
    def greedy(self, prompts: torch.Tensor) -> torch.Tensor:
        """``rlvr.loop.evaluation.EvalSampler.greedy``: prompts [M, n] -> [R*M, 1, n]."""
        m, n = prompts.shape
        return self.forward(prompts).logits.reshape(self.runs * m, 1, n, -1).argmax(dim=-1)

    def sample(self, prompts: torch.Tensor, count: int, temperature: float, generators: Sequence[torch.Generator]
               ) -> tuple[torch.Tensor, list[list[int]]]:
        """``EvalSampler.sample``: responses [R*M, count, n] and each one's tokens (R*M*count lists)."""
        m, n = prompts.shape
        responses = self.draw(prompts, count, temperature, generators).view(self.runs * m, count, n)
        return responses, responses.reshape(-1, n).tolist()

    def grad_norms(self) -> torch.Tensor:
        """Each run's total gradient norm [R], the norms of its parameters in module order."""
        norms = [torch.linalg.vector_norm(self.grads[k].reshape(self.runs, -1), dim=1) for k in self.NAMES]
        return torch.linalg.vector_norm(torch.stack(norms, dim=1), dim=1)


# ---------------------------------------------------------------- training


@dataclass
class BatchedRollout:
    """One epoch's batch of every run: what its inner steps share (``NaiveBatch`` with a run
    axis), each run's stats record and its per-prompt solved shares."""

    batch: NaiveBatch
    stats: list[Record]
    solved: list[dict[str, float]]


def train_batched(
    configs: Sequence[Config],
    states: Sequence[tuple[Task, TrainState]] | None = None,
    on_record: Sequence[Callable[[Record], None]] | None = None,
    on_epoch_end: Sequence[Callable[[TrainState], None]] | None = None,
) -> list[list[Record]]:
    """Train R runs that differ only in seed and delta mode as one batch; returns each
    run's records, equal to ``rlvr.loop.trainer.train(configs[r])`` but for the timings.

    ``states``: each run's ``setup`` (made here when None), at its start. ``on_record[r]``
    sees run r's records as they are made; ``on_epoch_end[r]`` its TrainState after each
    epoch (policy weights, optimizer and scheduler state current, for a checkpoint).
    Raises ConfigError naming why runs cannot be batched (``batching_refusal``).
    """
    reason = batching_refusal(configs)
    if reason is not None:
        raise ConfigError(reason)
    runs = len(configs)
    states = list(states) if states is not None else [setup(c) for c in configs]
    if any(st.step or st.epoch or st.records or st.rollout is not None for _, st in states):
        raise ConfigError("batched runs start from the beginning (resume a run one by one)")
    config, task, sts = configs[0], states[0][0], [st for _, st in states]
    emits = list(on_record) if on_record is not None else [lambda record: None] * runs
    a = config.algo
    model = BatchedPositional([st.policy.module for st in sts])
    prompts = task.sample_prompts(config.task.prompts_per_epoch, sts[0].generator)  # fixed: [B, n]
    distinct, _ = consecutive_groups(prompts.repeat_interleave(a.group_size, dim=0))  # [U, n]
    # the M of every batched forward: the step's prompts, the distinct ones, each evaluation chunk
    eval_size, num_eval = config.log.eval_batch_size, len(task.eval_prompts())
    rows = [prompts.shape[0], distinct.shape[0]] + [min(eval_size, num_eval - s) for s in range(0, num_eval, eval_size)]
    bad = model.inexact_matmul(rows)
    if bad is not None:
        raise ConfigError(f"batched runs: this machine's batched matmul rounds differently from the single "
                          f"one at {bad}; run them one by one")
    optimizer = build_optimizer(config.optim, [p for params in model.params for p in params])
    scheduler = build_scheduler(config.optim, optimizer, a.epochs * a.inner_steps)
    for st, params in zip(sts, model.params):  # a run's own optimizer holds its parameters: skip_step drops them
        st.optimizer.param_groups[0]["params"] = params
        st.optimizer.state.clear()
    records: list[list[Record]] = [[] for _ in range(runs)]

    def record(r: int, *new: Record) -> None:
        for rec in new:
            records[r].append(rec)
            sts[r].records.append(rec)
            emits[r](rec)

    step = epoch = 0
    if config.log.eval_at_start:
        for r, recs in enumerate(evaluate_runs(configs, task, model, 0, 0)):
            record(r, *recs)
    while epoch < a.epochs:
        rollout = collect_batched(configs, task, model, prompts, [st.generator for st in sts])
        if config.log.prompt_records:
            for r in range(runs):
                record(r, {"kind": "prompts", "epoch": epoch, "step": step, "solved": rollout.solved[r]})
        for inner in range(a.inner_steps):
            clock = time.perf_counter()
            metrics = step_batched(config, model, rollout)
            skipped = [not all(map(math.isfinite, m.values())) for m in metrics]
            for st, m, skip in zip(sts, metrics, skipped):
                st.epoch, st.step, st.inner_step = epoch, step, inner
                if skip:  # the run's parameters lose their gradient: the shared optimizer leaves them alone
                    skip_step(st, st.policy.module, m, config.optim.max_bad_steps)
                else:
                    st.bad_steps = 0
            optimizer_update(optimizer)
            model.restore_grads([r for r, skip in enumerate(skipped) if skip])
            lr = scheduler.get_last_lr()[0]
            scheduler.step()
            seconds = (time.perf_counter() - clock) / runs
            for r in range(runs):
                record(r, {"kind": "train", "epoch": epoch, "step": step, **metrics[r],
                           "skipped_step": float(skipped[r]), **rollout.stats[r], "lr": lr, "time/step": seconds})
            step += 1
        epoch += 1
        for st in sts:
            st.epoch, st.step, st.inner_step = epoch, step, 0
        if epoch % config.log.eval_every == 0 or epoch == a.epochs:
            for r, recs in enumerate(evaluate_runs(configs, task, model, epoch, step)):
                record(r, *recs)
        if on_epoch_end is not None:
            for r, st in enumerate(sts):
                sync_state(st, model.params[r], optimizer, scheduler)
                on_epoch_end[r](st)
    return records


def sync_state(st: TrainState, params: list[nn.Parameter], optimizer: torch.optim.Optimizer,
               scheduler: torch.optim.lr_scheduler.LambdaLR) -> None:
    """Make run ``st``'s own optimizer and scheduler hold its part of the shared ones (its
    parameters' Adam state, the learning rate, the schedule's position)."""
    for p in params:
        if p in optimizer.state:
            st.optimizer.state[p] = optimizer.state[p]
    st.optimizer.param_groups[0]["lr"] = optimizer.param_groups[0]["lr"]
    st.scheduler.load_state_dict(scheduler.state_dict())


def collect_batched(configs: Sequence[Config], task: Task, model: BatchedPositional, prompts: torch.Tensor,
                    generators: Sequence[torch.Generator]) -> BatchedRollout:
    """Every run's epoch batch, as ``collect_rollout`` makes it: G responses per prompt
    drawn with the run's generator, graded, its deltas, loss weights and stats."""
    config, runs = configs[0], model.runs
    g, (b, n) = config.algo.group_size, prompts.shape
    clock = time.perf_counter()
    responses = model.draw(prompts, g, config.policy.temperature, generators)  # [R, B, G, n]
    generate = time.perf_counter() - clock
    clock = time.perf_counter()
    grades = task.grade(prompts.repeat(runs, 1), responses.reshape(runs * b, g, n))
    reward = time.perf_counter() - clock
    clock = time.perf_counter()
    rewards, correct = grades.rewards.view(runs, b, g), grades.correct.view(runs, b, g)
    deltas = torch.empty(runs, b * g)
    for mode in dict.fromkeys(c.algo.deltas for c in configs):  # the runs of one mode at once: rows are groups
        idx = torch.tensor([r for r, c in enumerate(configs) if c.algo.deltas == mode])
        grouped = rewards[idx].reshape(-1, g)  # every response n tokens (reinforce_pp whitens over tokens)
        deltas[idx] = core.compute_deltas(grouped, mode, eps=config.algo.adv_eps, lengths=torch.full_like(grouped, n)
                                          ).view(len(idx), b * g)
    mask = torch.ones(b * g, n, dtype=torch.bool)  # every response n tokens, all the policy's
    weights = core.aggregation_weights(mask, config.algo.aggregation,
                                       n if config.algo.normalizer is None else config.algo.normalizer)  # [N, n]
    batch = naive_batch(prompts.repeat_interleave(g, dim=0), responses.reshape(runs, b * g, n), deltas, weights,
                        mask, model.vocab)
    score = time.perf_counter() - clock
    tokens = b * g * n
    common = {"time/generate": generate / runs, "time/reward": reward / runs, "time/score": score / runs,
              "response_tokens": tokens, "tokens_per_sec_generate": tokens / max(generate / runs, 1e-9),
              "response_length": float(n)}
    stats = [{**s, **grades.metrics, **common, **hack} for s, hack in
             zip(rollout_stats(rewards, correct, deltas, g),
                 max_reward_stats(rewards, correct, task.max_reward, reward_is_gold=task.reward_is_gold))]
    solved = prompt_solve_shares(prompts, correct)
    return BatchedRollout(batch, stats, solved)


def step_batched(config: Config, model: BatchedPositional, rollout: BatchedRollout) -> list[dict[str, float]]:
    """Every run's gradient of the naive loss in ``model.grads`` (``naive_gradients`` over the
    run axis), clipped when configured; returns each run's ``step_metrics``."""
    runs = model.runs
    _, sums = naive_gradients(model.embedding, model.encode, model.decode, rollout.batch,
                              config.policy.temperature, config.log.entropy, grads=model.grads,
                              buffers=model.workspace)
    norm = model.grad_norms()  # [R]
    max_norm = config.optim.max_grad_norm
    if max_norm is not None:
        clip = torch.clamp(max_norm / (norm + 1e-6), max=1.0).view(runs, 1, 1)
        for g in model.grads.values():
            g.view(runs, -1, g.shape[-1]).mul_(clip)
    by_name = step_metrics(sums, norm)  # each name: R numbers
    return [dict(zip(by_name, row)) for row in zip(*by_name.values())]
