"""Several runs of the positional sorting toy as one batched computation.

``rlvr compare`` trains the same configuration with several seeds and delta modes. Each
run's step is a few dozen tiny tensor operations, so its time is per-operation overhead;
``train_batched`` gives every tensor a leading run axis R and takes all runs' steps in
one pass, with records equal to ``rlvr.trainer.train`` run by run (``==`` on every
number but the ``time/*`` timings and ``tokens_per_sec_generate``; ``tests/test_batched.py``).

What keeps the numbers bit for bit:
  * random draws: each run keeps its own ``torch.Generator``; the multinomial draws are
    one call per run on that run's rows of the batched probabilities (cheap), the math
    around them is batched.
  * matmuls: MKL's batched GEMM gives the single GEMM's bits only when every run's
    operands and output start on a 64-byte boundary (a run's slice of a plain
    ``[R, ...]`` tensor sits at an arbitrary offset and can round differently, as can a
    single GEMM on such a slice). Every tensor that enters a ``bmm`` is therefore laid
    out by ``aligned_empty``, and ``exact_bmm_check`` verifies on this machine, before
    any work, that the aligned batched GEMM equals the single one at every shape used.
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
from functools import cache
from typing import Any

import torch
from torch import nn

from rlvr import core
from rlvr.config import Config
from rlvr.diagnostics import max_reward_stats, prompt_solve_shares
from rlvr.errors import ConfigError
from rlvr.evaluation import pass_at_k, sample_table
from rlvr.metrics import Record
from rlvr.optim import build_optimizer, build_scheduler
from rlvr.policies.positional import consecutive_groups
from rlvr.rollout import Task
from rlvr.trainer import TrainingError, TrainState, rollout_stats, setup

ALIGN = 16  # floats per 64 bytes: every run's block of a batched tensor starts on this boundary
DIFFERING_FIELDS = ("name", "out_dir", "seed", "algo.deltas")  # what runs of one batch may differ in
TIMING_KEYS = ("time/generate", "time/reward", "time/score", "time/step", "tokens_per_sec_generate")


def aligned_empty(runs: int, *shape: int) -> torch.Tensor:
    """An uninitialised ``[runs, *shape]`` float tensor whose run blocks each start on a
    64-byte boundary (the CPU allocator aligns the storage to 64 bytes; each run's block
    is padded to a multiple of 16 floats). Each ``t[r]`` is contiguous."""
    size = math.prod(shape)
    stride = -(-size // ALIGN) * ALIGN
    return torch.empty(runs, stride)[:, :size].view(runs, *shape)


def aligned_copy(x: torch.Tensor) -> torch.Tensor:
    """``x`` [R, ...] copied into an ``aligned_empty`` tensor."""
    out = aligned_empty(*x.shape)
    out.copy_(x)
    return out


@cache
def matmul_strategy(runs: int, m: int, k: int, n: int, a_transposed: bool, b_transposed: bool) -> str | None:
    """How [R, m, k] @ [R, k, n] (aligned operands and output) gives the bits of R single
    ``mm`` calls on freshly allocated operands, as one run computes them on this machine:
    "bmm" (one batched call), "loop" (one ``mm`` per run: ``bmm`` of small matrices takes
    a plain loop that rounds differently), or None (neither). ``*_transposed``: the
    operand is a transposed view, as in the run's code. Checked on random numbers."""
    gen = torch.Generator().manual_seed(m * 1000 + k * 10 + n)
    a, b = torch.randn(runs, m, k, generator=gen), torch.randn(runs, k, n, generator=gen)

    def layout(x: torch.Tensor, transposed: bool) -> torch.Tensor:  # the values of x, the strides of the code
        if transposed:
            return aligned_empty(x.shape[0], x.shape[2], x.shape[1]).transpose(1, 2).copy_(x)
        return aligned_copy(x)

    single = torch.stack([
        layout(a[r : r + 1], a_transposed)[0].clone(memory_format=torch.preserve_format)
        @ layout(b[r : r + 1], b_transposed)[0].clone(memory_format=torch.preserve_format)
        for r in range(runs)])
    a, b = layout(a, a_transposed), layout(b, b_transposed)
    for strategy in ("bmm", "loop"):
        if torch.equal(batched_mm(a, b, aligned_empty(runs, m, n), strategy), single):
            return strategy
    return None


def batched_mm(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, strategy: str | None = None) -> torch.Tensor:
    """out [R, m, n] = a [R, m, k] @ b [R, k, n], run by run as a single run computes it
    (``matmul_strategy``; all three aligned)."""
    if strategy is None:
        strategy = matmul_strategy(a.shape[0], a.shape[1], a.shape[2], b.shape[2], _transposed(a), _transposed(b))
    if strategy == "bmm":
        return torch.bmm(a, b, out=out)
    for r in range(a.shape[0]):
        torch.mm(a[r], b[r], out=out[r])
    return out


def _transposed(x: torch.Tensor) -> bool:
    """Whether the last two dims of x are laid out transposed (column-major)."""
    return x.stride(-1) != 1


# ---------------------------------------------------------------- which runs can be batched


def batching_refusal(configs: Sequence[Config]) -> str | None:
    """Why ``configs`` cannot train as one batch (None: they can): the positional policy
    on the sorting task with fixed prompts, the naive loss without KL, importance weights,
    micro-batches, user rewards or Ray workers, all equal but in DIFFERING_FIELDS."""
    if not configs:
        return "no runs"
    c = configs[0]
    needs = {
        "policy.name=positional": c.policy.name == "positional",
        "task.name=sorting": c.task.name == "sorting",
        "fixed task.prompts (not null)": c.task.prompts is not None,
        "algo.loss=naive": c.algo.loss == "naive",
        "algo.kl_coef=0": c.algo.kl_coef == 0,
        "algo.tis_cap=null": c.algo.tis_cap is None,
        "optim.micro_batches=1": c.optim.micro_batches == 1,
        "rewards.functions=[]": not c.rewards.functions,
        "cluster.rollout_workers=0": c.cluster.rollout_workers == 0,
        "algo.entropy_coef=0": c.algo.entropy_coef == 0,
        "algo.dynamic_sampling=false": not c.algo.dynamic_sampling,
        "algo.overlong=none": c.algo.overlong == "none",
        "algo.top_entropy_q=null": c.algo.top_entropy_q is None,
        "log.grad_noise_every=0": c.log.grad_noise_every == 0,
    }
    missing = [need for need, ok in needs.items() if not ok]
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


# ---------------------------------------------------------------- the batched model


@dataclass
class Forward:
    """One batched forward pass, kept for the backward: x [R, M, n*D], state [R, M, D],
    decode_flat [R, D, n*D], out [R, M, n*D], logits [R, M*n, V] (all aligned)."""

    x: torch.Tensor
    state: torch.Tensor
    decode_flat: torch.Tensor
    out: torch.Tensor
    logits: torch.Tensor


class BatchedPositional:
    """The positional model's weights of R runs as aligned [R, ...] tensors; each run's
    module parameters become views of them (so a run's policy always holds its current
    weights, e.g. for a checkpoint). The math is ``PositionalModel.forward`` and
    ``_PositionalLogProbs`` with a leading run axis."""

    def __init__(self, modules: Sequence[nn.Module]):
        runs = len(modules)
        self.embedding = aligned_copy(torch.stack([m.embedding.weight.detach() for m in modules]))  # [R, V, D]
        self.encode = aligned_copy(torch.stack([m.encode.detach() for m in modules]))  # [R, n, D, D]
        self.decode = aligned_copy(torch.stack([m.decode.detach() for m in modules]))  # [R, n, D, D]
        self.grads = {name: aligned_empty(*getattr(self, name).shape) for name in ("embedding", "encode", "decode")}
        self.params: list[list[nn.Parameter]] = []  # per run, in module.parameters() order
        for r, m in enumerate(modules):
            m.encode = nn.Parameter(self.encode[r])
            m.decode = nn.Parameter(self.decode[r])
            m.embedding.weight = nn.Parameter(self.embedding[r])
            owned = {"encode": m.encode, "decode": m.decode, "embedding": m.embedding.weight}
            for name, p in owned.items():
                p.grad = self.grads[name][r]
            self.params.append(list(m.parameters()))
        _, self.vocab, self.dim = self.embedding.shape
        self.runs, self.length = runs, self.encode.shape[1]

    def check_exact(self, rows: Sequence[int]) -> None:
        """Refuse (ConfigError) when this machine's batched GEMM differs from the single one
        at a shape the runs use (``rows``: the M of each forward pass)."""
        r, n, d, v = self.runs, self.length, self.dim, self.vocab
        for m in set(rows):
            shapes = [(m, n * d, d, False, False), (m, d, n * d, False, False), (m * n, d, v, False, True),
                      (v, m * n, d, True, False), (m * n, v, d, False, False), (d, m, n * d, True, False),
                      (m, n * d, d, False, True), (n * d, m, d, True, False), (m, d, n * d, False, True)]
            bad = [s for s in shapes if matmul_strategy(r, *s) is None]
            if bad:
                raise ConfigError(f"batched runs: this machine's batched matmul rounds differently from the single "
                                  f"one at [m, k, n, a^T, b^T] = {bad[0]}; run them one by one")

    def forward(self, prompts: torch.Tensor) -> Forward:
        """prompts [M, n], shared by the runs -> Forward with logits [R, M*n, V]."""
        r, (m, n), d, v = self.runs, prompts.shape, self.dim, self.vocab
        x = aligned_empty(r, m, n * d)
        x.view(r, m * n, d).copy_(self.embedding[:, prompts.reshape(-1)])  # [R, M*n, D]
        state = batched_mm(x, self.encode.view(r, n * d, d), out=aligned_empty(r, m, d))  # [R, M, D]
        decode_flat = aligned_empty(r, d, n * d)
        decode_flat.view(r, d, n, d).copy_(self.decode.transpose(1, 2))  # per run decode.transpose(0, 1)
        out = batched_mm(state, decode_flat, out=aligned_empty(r, m, n * d))  # [R, M, n*D]
        logits = batched_mm(out.view(r, m * n, d), self.embedding.transpose(1, 2),
                           out=aligned_empty(r, m * n, v))  # [R, M*n, V], tied output
        return Forward(x, state, decode_flat, out, logits)

    def backward(self, f: Forward, prompts: torch.Tensor, probs: torch.Tensor, grad_chosen: torch.Tensor,
                 temperature: float) -> None:
        """Gradients into ``self.grads`` (each run's ``.grad``): ``_PositionalLogProbs.backward``
        per run. probs, grad_chosen [R, U*n, V]: softmax and the gradient on the log-probs
        summed per (prompt, position, token)."""
        r, (u, n), d = self.runs, prompts.shape, self.dim
        grad_logits = aligned_empty(r, u * n, self.vocab)
        torch.sub(grad_chosen, probs * grad_chosen.sum(dim=-1, keepdim=True), out=grad_logits)
        if temperature != 1.0:
            torch.div(grad_logits, temperature, out=grad_logits)
        g_embedding, g_encode, g_decode = self.grads["embedding"], self.grads["encode"], self.grads["decode"]
        batched_mm(grad_logits.transpose(1, 2), f.out.view(r, u * n, d), out=g_embedding)  # output side
        grad_out = batched_mm(grad_logits, self.embedding, out=aligned_empty(r, u * n, d)).view(r, u, n * d)
        grad_decode_t = batched_mm(f.state.transpose(1, 2), grad_out, out=aligned_empty(r, d, n * d))
        g_decode.copy_(grad_decode_t.view(r, d, n, d).transpose(1, 2))
        grad_state = batched_mm(grad_out, f.decode_flat.transpose(1, 2), out=aligned_empty(r, u, d))
        batched_mm(f.x.transpose(1, 2), grad_state, out=g_encode.view(r, n * d, d))
        grad_x = batched_mm(grad_state, self.encode.view(r, n * d, d).transpose(1, 2), out=aligned_empty(r, u, n * d))
        g_embedding.index_add_(1, prompts.reshape(-1), grad_x.view(r, u * n, d))  # the input side

    def grad_norms(self) -> torch.Tensor:
        """Each run's total gradient norm [R], the norms of its parameters in module order."""
        norms = [torch.linalg.vector_norm(self.grads[k].reshape(self.runs, -1), dim=1)
                 for k in ("encode", "decode", "embedding")]
        return torch.linalg.vector_norm(torch.stack(norms, dim=1), dim=1)


# ---------------------------------------------------------------- training


@dataclass
class BatchedRollout:
    """One epoch's batch of every run: responses [R, B, G, n], deltas [R, N], each
    response's distinct prompt [N] (the same for every run), the flat index of each
    chosen log-prob [R, N, n] into [R*U*n*V], each run's stats record and its per-prompt
    solved shares."""

    responses: torch.Tensor
    deltas: torch.Tensor
    row_prompt: torch.Tensor
    chosen: torch.Tensor
    stats: list[Record]
    solved: list[dict[str, float]]


def train_batched(
    configs: Sequence[Config],
    states: Sequence[tuple[Task, TrainState]] | None = None,
    on_record: Sequence[Callable[[Record], None]] | None = None,
    on_epoch_end: Sequence[Callable[[TrainState], None]] | None = None,
) -> list[list[Record]]:
    """Train R runs that differ only in seed and delta mode as one batch; returns each
    run's records, equal to ``rlvr.trainer.train(configs[r])`` but for the timings.

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
    config, task = configs[0], states[0][0]
    emits = list(on_record) if on_record is not None else [lambda record: None] * runs
    a = config.algo
    model = BatchedPositional([st.policy.module for _, st in states])
    prompts = task.sample_prompts(config.task.prompts_per_epoch, states[0][1].generator)  # fixed: [B, n]
    distinct, row_prompt = consecutive_groups(prompts.repeat_interleave(a.group_size, dim=0))  # [U, n], [N]
    eval_prompts = task.eval_prompts()
    model.check_exact([prompts.shape[0], distinct.shape[0]]
                      + [len(eval_prompts[s : s + config.log.eval_batch_size])
                         for s in range(0, len(eval_prompts), config.log.eval_batch_size)])
    optimizer = build_optimizer(config.optim, [p for params in model.params for p in params])
    scheduler = build_scheduler(config.optim, optimizer, a.epochs * a.inner_steps)
    generators = [st.generator for _, st in states]
    records: list[list[Record]] = [[] for _ in range(runs)]

    def record(r: int, *new: Record) -> None:
        for rec in new:
            records[r].append(rec)
            states[r][1].records.append(rec)
            emits[r](rec)

    step = epoch = 0
    if config.log.eval_at_start:
        for r, recs in enumerate(evaluate_batched(configs, task, model, eval_prompts, 0, 0)):
            record(r, *recs)
    bad_steps = [0] * runs
    while epoch < a.epochs:
        rollout = collect_batched(configs, task, model, prompts, distinct, generators)
        if config.log.prompt_records:
            for r in range(runs):
                record(r, {"kind": "prompts", "epoch": epoch, "step": step, "solved": rollout.solved[r]})
        weights = core.aggregation_weights(torch.ones(row_prompt.shape[0], model.length, dtype=torch.bool),
                                           a.aggregation, model.length if a.normalizer is None else a.normalizer)
        for _ in range(a.inner_steps):
            clock = time.perf_counter()
            metrics = step_batched(config, model, distinct, rollout, weights)
            skipped = [not all(math.isfinite(v) for v in m.values()) for m in metrics]
            for r in range(runs):
                bad_steps[r] = bad_steps[r] + 1 if skipped[r] else 0
                if bad_steps[r] >= config.optim.max_bad_steps:
                    raise TrainingError(f"{configs[r].name}: {bad_steps[r]} consecutive steps with non-finite values "
                                        f"at epoch {epoch}, step {step}; stopping")
            _optimizer_step(optimizer, model, skipped)
            lr = scheduler.get_last_lr()[0]
            scheduler.step()
            seconds = (time.perf_counter() - clock) / runs
            for r in range(runs):
                record(r, {"kind": "train", "epoch": epoch, "step": step, **metrics[r],
                           "skipped_step": float(skipped[r]), **rollout.stats[r], "lr": lr, "time/step": seconds})
            step += 1
        epoch += 1
        if epoch % config.log.eval_every == 0 or epoch == a.epochs:
            for r, recs in enumerate(evaluate_batched(configs, task, model, eval_prompts, epoch, step)):
                record(r, *recs)
        for r, (_, st) in enumerate(states):
            st.epoch, st.step, st.bad_steps, st.inner_step = epoch, step, bad_steps[r], 0
        if on_epoch_end is not None:
            for r, (_, st) in enumerate(states):
                sync_state(st, model.params[r], optimizer, scheduler)
                on_epoch_end[r](st)
    return records


def _optimizer_step(optimizer: torch.optim.Optimizer, model: BatchedPositional, skipped: list[bool]) -> None:
    """One step of every run but the skipped ones: a parameter without a gradient is left
    alone, its Adam step count too, as a run alone skips the step."""
    if any(skipped):
        for r in (r for r, s in enumerate(skipped) if s):
            for p in model.params[r]:
                p.grad = None
        optimizer.step()
        for r in (r for r, s in enumerate(skipped) if s):
            for name, p in zip(("encode", "decode", "embedding"), model.params[r]):
                p.grad = model.grads[name][r]
    else:
        optimizer.step()


def sync_state(st: TrainState, params: list[nn.Parameter], optimizer: torch.optim.Optimizer,
               scheduler: torch.optim.lr_scheduler.LambdaLR) -> None:
    """Make run ``st``'s own optimizer and scheduler hold its part of the shared ones (its
    parameters' Adam state, the learning rate, the schedule's position)."""
    if any(a is not b for a, b in zip(st.optimizer.param_groups[0]["params"], params, strict=True)):
        st.optimizer.param_groups[0]["params"] = params
        st.optimizer.state.clear()
    for p in params:
        if p in optimizer.state:
            st.optimizer.state[p] = optimizer.state[p]
    st.optimizer.param_groups[0]["lr"] = optimizer.param_groups[0]["lr"]
    st.scheduler.load_state_dict(scheduler.state_dict())


def collect_batched(configs: Sequence[Config], task: Task, model: BatchedPositional, prompts: torch.Tensor,
                    distinct: torch.Tensor, generators: Sequence[torch.Generator]) -> BatchedRollout:
    """Every run's epoch batch, as ``collect_rollout`` makes it: G responses per prompt
    drawn with the run's generator, graded, its deltas and stats."""
    config, runs = configs[0], model.runs
    g, (b, n), v = config.algo.group_size, prompts.shape, model.vocab
    clock = time.perf_counter()
    responses = sample_batched(model, prompts, g, config.policy.temperature, generators)  # [R, B, G, n]
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
    # The flat index of each response token's log-prob in the [R, U*n, V] log-softmax.
    _, row_prompt = consecutive_groups(prompts.repeat_interleave(g, dim=0))
    u = distinct.shape[0]
    response_ids = responses.reshape(runs, b * g, n)  # [R, N, n]
    chosen = ((row_prompt.unsqueeze(1) * n + torch.arange(n)) * v + response_ids  # [R, N, n]
              + (torch.arange(runs) * (u * n * v)).view(runs, 1, 1))
    score = time.perf_counter() - clock
    tokens = b * g * n
    common = {"time/generate": generate / runs, "time/reward": reward / runs, "time/score": score / runs,
              "response_tokens": tokens, "tokens_per_sec_generate": tokens / max(generate / runs, 1e-9)}
    stats = [{**s, **grades.metrics, **common, "response_length": float(n),
              **max_reward_stats(rewards[r], correct[r], getattr(task, "max_reward", None))}
             for r, s in enumerate(_rollout_stats(rewards, correct, deltas, g))]
    solved = [prompt_solve_shares(prompts, correct[r]) for r in range(runs)]
    return BatchedRollout(responses, deltas, row_prompt, chosen, stats, solved)


def _rollout_stats(rewards: torch.Tensor, correct: torch.Tensor, deltas: torch.Tensor, group_size: int
                   ) -> list[Record]:
    """``rollout_stats`` of every run; rewards, correct [R, B, G], deltas [R, N]. Batched
    when every reward is finite (then a run's reductions are over whole rows)."""
    runs = rewards.shape[0]
    if not bool(torch.isfinite(rewards).all()):
        return [rollout_stats(rewards[r], correct[r], deltas[r], group_size) for r in range(runs)]
    flat = rewards.reshape(runs, -1)  # [R, N]
    zero_groups = (deltas.reshape(runs, -1, group_size) == 0).all(dim=2)  # [R, B]
    columns = torch.stack([flat.mean(dim=1), flat.std(dim=1), correct.reshape(runs, -1).float().mean(dim=1),
                           zero_groups.float().mean(dim=1)], dim=1).tolist()
    keys = ("reward_mean", "reward_std", "solve_rate", "frac_zero_delta_groups")
    return [{**dict(zip(keys, row)), "abstain_frac": 0.0} for row in columns]


@torch.no_grad()
def sample_batched(model: BatchedPositional, prompts: torch.Tensor, group_size: int, temperature: float,
                   generators: Sequence[torch.Generator]) -> torch.Tensor:
    """``PositionalPolicy.sample`` of every run: prompts [M, n] -> responses [R, M, G, n],
    each run's draws from its own generator."""
    runs, (m, n) = model.runs, prompts.shape
    logits = model.forward(prompts).logits.reshape(runs, m, n, -1) / temperature  # [R, M, n, V]
    probs = torch.log_softmax(logits, dim=-1).exp().reshape(runs, m * n, -1)  # [R, M*n, V]
    tokens = torch.stack([torch.multinomial(probs[r], group_size, replacement=True, generator=gen)
                          for r, gen in enumerate(generators)])  # [R, M*n, G]
    return tokens.reshape(runs, m, n, group_size).transpose(2, 3).contiguous()


def step_batched(config: Config, model: BatchedPositional, distinct: torch.Tensor, rollout: BatchedRollout,
                 weights: torch.Tensor) -> list[dict[str, float]]:
    """Every run's gradient of the naive loss sum(w * -delta * log pi) in ``model.grads``,
    clipped when configured; returns each run's step metrics as ``step_metrics`` names them.
    weights [N, n], the same for every run."""
    runs, temperature = model.runs, config.policy.temperature
    f = model.forward(distinct)
    logits = f.logits if temperature == 1.0 else f.logits / temperature
    all_log_probs = torch.log_softmax(logits, dim=-1)  # [R, U*n, V]
    probs = all_log_probs.exp()
    log_probs = all_log_probs.take(rollout.chosen)  # [R, N, n]
    deltas = rollout.deltas.unsqueeze(-1)  # [R, N, 1]
    pg = -deltas * log_probs  # [R, N, n]
    loss = torch.where(weights > 0, pg * weights, 0.0).sum(dim=(1, 2))  # [R]; pg_loss is the same sum
    grad_chosen = torch.zeros(all_log_probs.numel())
    grad_chosen.scatter_add_(0, rollout.chosen.reshape(-1), (weights * -deltas).reshape(-1))  # d loss / d log pi
    model.backward(f, distinct, probs, grad_chosen.view_as(probs), temperature)
    norm = model.grad_norms()  # [R]
    max_norm = config.optim.max_grad_norm
    if max_norm is not None:
        clip = torch.clamp(max_norm / (norm + 1e-6), max=1.0).view(runs, 1, 1)
        for g in model.grads.values():
            g.view(runs, -1, g.shape[-1]).mul_(clip)
    u, n = distinct.shape
    tokens = rollout.chosen.shape[1] * n
    values = [loss, loss, torch.zeros(runs), torch.zeros(runs), norm]
    if config.log.entropy:
        entropy = -(probs * all_log_probs).sum(dim=-1).reshape(runs, u, n)  # [R, U, n]
        values.append(entropy[:, rollout.row_prompt].sum(dim=(1, 2)) / tokens)
    keys = ("loss", "pg_loss", "kl", "clip_frac", "grad_norm", "entropy")
    return [dict(zip(keys, row)) for row in torch.stack(values, dim=1).tolist()]


# ---------------------------------------------------------------- evaluation


@torch.no_grad()
def evaluate_batched(configs: Sequence[Config], task: Task, model: BatchedPositional, prompts: torch.Tensor,
                     epoch: int, step: int) -> list[list[Record]]:
    """``rlvr.evaluation.evaluate`` of every run: its eval and samples records, each run
    sampling with its own evaluation generator."""
    config, runs = configs[0], model.runs
    samples, size = config.log.eval_samples, config.log.eval_batch_size
    gens = [torch.Generator().manual_seed(c.seed + 1_000_003 + epoch) for c in configs]
    greedy, sampled, first = [], [], None
    for start in range(0, len(prompts), size):
        chunk = prompts[start : start + size]  # [M, n]
        m, n = chunk.shape
        logits = model.forward(chunk).logits.reshape(runs, m, n, -1)
        best = logits.argmax(dim=-1).unsqueeze(2)  # [R, M, 1, n]
        greedy.append(task.grade(chunk.repeat(runs, 1), best.reshape(runs * m, 1, n)))
        responses = sample_batched(model, chunk, samples, config.policy.temperature, gens)  # [R, M, S, n]
        sampled.append(task.grade(chunk.repeat(runs, 1), responses.reshape(runs * m, samples, n)))
        first = first or (chunk, responses, sampled[-1])

    def per_run(grades: list, key: str) -> torch.Tensor:  # [R, B, k]
        return torch.cat([getattr(g, key).view(runs, -1, getattr(g, key).shape[-1]) for g in grades], dim=1)

    greedy_rewards, greedy_correct = per_run(greedy, "rewards"), per_run(greedy, "correct")
    rewards, correct = per_run(sampled, "rewards"), per_run(sampled, "correct")
    out = []
    for r in range(runs):
        rec: Record = {
            "kind": "eval", "epoch": epoch, "step": step,
            "greedy_solve_rate": greedy_correct[r].float().mean().item(),
            "greedy_reward": greedy_rewards[r].nanmean().item(),
            "sampled_solve_rate": correct[r].float().mean().item(),
            "sampled_reward": rewards[r].nanmean().item(),
        }
        for k in sorted({1, samples}):
            rec[f"pass@{k}"] = pass_at_k(samples, correct[r].sum(dim=1), k).mean().item()
        chunk, responses, grades = first
        m = chunk.shape[0]
        first_grades = _Grades(grades.rewards.view(runs, m, -1)[r], grades.correct.view(runs, m, -1)[r])
        out.append([rec, sample_table(chunk, responses[r], first_grades, epoch, step, config.log.table_rows)])
    return out


@dataclass
class _Grades:
    """What ``sample_table`` reads of a run's grades: rewards, correct [M, S]."""

    rewards: torch.Tensor
    correct: torch.Tensor


def records_equal(a: Record, b: Record) -> bool:
    """Two records equal in every number but the timings (TIMING_KEYS)."""
    def strip(rec: Record) -> dict[str, Any]:
        return {k: v for k, v in rec.items() if k not in TIMING_KEYS}

    return strip(a) == strip(b)
