"""Evaluation on the task's fixed eval prompts (held-out ones, or the training prompts in
the lecture's setting): solve rates, rewards, pass@k, a samples table."""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Sequence
from typing import Any, Protocol

import torch
from tqdm import tqdm

from rlvr.base.interfaces import Policy, Task
from rlvr.base.record import Record
from rlvr.base.rollout import Grades
from rlvr.config import Config
from rlvr.rewards import TrainerState


def pass_at_k(num_samples: int, num_correct: torch.Tensor, k: int) -> torch.Tensor:
    """Unbiased pass@k from n samples with c correct: 1 - C(n-c, k) / C(n, k), per prompt.

    num_correct: counts of any shape ([B], or [R, B] for R runs) -> float, the same shape.
    Computed as a stable product:
    C(n-c, k) / C(n, k) = prod_{i=n-c+1}^{n} (1 - k / i).
    """
    n = num_samples
    if not 1 <= k <= n:
        raise ValueError(f"pass@{k} needs 1 <= k <= n={n}")
    out = []
    for c in num_correct.reshape(-1).tolist():
        if n - c < k:
            out.append(1.0)
        else:
            out.append(1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1)))
    return torch.tensor(out).view(num_correct.shape)


def eval_prompts_label(config: Config) -> str:
    """What the evaluation is on, for figures and tables: "training prompts" when the
    task evaluates the prompts it trains on (the sorting task with fixed ``task.options.prompts``,
    the lecture's setting: its solve rate says nothing about prompts it has not seen),
    else "held-out prompts"."""
    if config.task.name == "sorting" and config.task.options.prompts is not None:
        return "training prompts"
    return "held-out prompts"


class EvalSampler(Protocol):
    """Greedy and sampled responses of R runs to one chunk of M eval prompts, in the form
    ``Task.grade`` takes for the chunk repeated R times: run r's responses are rows
    r*M .. (r+1)*M. One policy is R = 1 (``PolicySampler``); ``rlvr.loop.batched`` samples R
    runs of the positional model at once."""

    runs: int

    def greedy(self, prompts: Any) -> Any:
        """Each run's argmax response per prompt: [R*M, 1, ...]."""
        ...

    def sample(self, prompts: Any, count: int, temperature: float, generators: Sequence[torch.Generator]
               ) -> tuple[Any, list[list[int]]]:
        """``count`` responses per prompt and run, run r's drawn with ``generators[r]``:
        responses [R*M, count, ...] and each response's token ids (R*M*count lists)."""
        ...


class PolicySampler:
    """One policy as an ``EvalSampler`` (R = 1)."""

    runs = 1

    def __init__(self, policy: Policy):
        self.policy = policy

    def greedy(self, prompts: Any) -> Any:
        return self.policy.greedy(prompts)

    def sample(self, prompts: Any, count: int, temperature: float, generators: Sequence[torch.Generator]
               ) -> tuple[Any, list[list[int]]]:
        samples = self.policy.sample(prompts, count, temperature, generators[0])
        return samples.responses, samples.completion_ids()


@torch.no_grad()
def evaluate(config: Config, task: Task, policy: Policy, epoch: int, step: int) -> list[Record]:
    """Greedy and sampled solve rate, pass@k and mean reward on the task's fixed eval
    prompts (``eval_prompts_label`` says whether they are held out): ``evaluate_runs`` of
    one run. Returns the eval record and a "samples" record (a few prompts with their
    sampled responses and rewards, for a person to read)."""
    return evaluate_runs([config], task, PolicySampler(policy), epoch, step)[0]


@torch.no_grad()
def evaluate_runs(configs: Sequence[Config], task: Task, sampler: EvalSampler, epoch: int, step: int
                  ) -> list[list[Record]]:
    """``evaluate`` of R runs that differ only in seed (``configs``, the sampler's runs):
    each run's eval and samples records, each run sampling with its own evaluation generator.

    Prompts go through the sampler ``log.eval_batch_size`` at a time (a real LM cannot
    decode a whole validation set at once); each chunk of every run is graded in one call.
    An evaluation of more than one chunk (minutes for a real LM on a CPU, where no progress
    bar moves) says on stderr when it starts and when it ends; one chunk is a batch's worth
    of sampling, and says nothing.
    """
    config, runs = configs[0], sampler.runs
    prompts = task.eval_prompts()
    n, size = config.log.eval_samples, config.log.eval_batch_size
    what, started, chunks = f"{len(prompts)} {eval_prompts_label(config)}", time.monotonic(), -(-len(prompts) // size)
    if chunks > 1:
        _say(f"evaluating {what} (greedy and {n} sampled responses each, {size} prompts at a time)")
    # A separate generator: evaluation must not change the training random stream.
    gens = [torch.Generator().manual_seed(c.seed + 1_000_003 + epoch) for c in configs]
    greedy, sampled, first = [], [], None
    state = TrainerState(step, epoch, config.algo.epochs * config.algo.inner_steps)  # reward functions' trainer_state
    for start in range(0, len(prompts), size):
        chunk = prompts[start : start + size]
        graded = chunk if runs == 1 else _repeat(chunk, runs)  # [R*M, ...]
        greedy.append(task.grade(graded, sampler.greedy(chunk), trainer_state=state))
        responses, completion_ids = sampler.sample(chunk, n, config.policy.temperature, gens)
        sampled.append(task.grade(graded, responses, completion_ids=completion_ids, trainer_state=state))
        first = first or (chunk, responses, sampled[-1])
    records = eval_records(runs, greedy, sampled, first, n, epoch, step, config.log.table_rows)
    if chunks > 1:
        rates = ", ".join(f"{r[0]['greedy_solve_rate']:.3f}" for r in records)  # each run's
        _say(f"evaluated {what} in {time.monotonic() - started:.1f} s: greedy solve rate {rates}")
    return records


def _say(line: str) -> None:
    """One line on stderr, written past a progress bar when one is drawn (tqdm's write)."""
    tqdm.write(f"rlvr: {line}", file=sys.stderr)


def _repeat(prompts: Any, runs: int) -> Any:
    """prompts [M, ...] (a tensor or a list) R times over: [R*M, ...]."""
    if torch.is_tensor(prompts):
        return prompts.repeat(runs, *[1] * (prompts.dim() - 1))
    return list(prompts) * runs


def eval_records(runs: int, greedy: Sequence[Grades], sampled: Sequence[Grades], first: tuple[Any, Any, Grades],
                 samples: int, epoch: int, step: int, table_rows: int) -> list[list[Record]]:
    """Each run's eval record and samples record from the graded chunks of R runs: greedy
    [R*M, 1] and sampled [R*M, S] per chunk, run by run (``EvalSampler``'s rows); ``first``
    the first chunk's prompts [M], responses and sampled grades.

    Each number is a reduction over one run's row of [R, B*k], which gives the bits of that
    run's reduction alone; all of them reach Python in one conversion."""

    def per_run(grades: Sequence[Grades], key: str) -> torch.Tensor:  # [R, B, k]
        return torch.cat([getattr(g, key).reshape(runs, -1, getattr(g, key).shape[-1]) for g in grades], dim=1)

    greedy_rewards, greedy_correct = per_run(greedy, "rewards"), per_run(greedy, "correct")  # [R, B, 1]
    rewards, correct = per_run(sampled, "rewards"), per_run(sampled, "correct")  # [R, B, S]
    columns = {
        "greedy_solve_rate": greedy_correct.reshape(runs, -1).float().mean(dim=1),
        "greedy_reward": greedy_rewards.reshape(runs, -1).nanmean(dim=1),
        "sampled_solve_rate": correct.reshape(runs, -1).float().mean(dim=1),
        "sampled_reward": rewards.reshape(runs, -1).nanmean(dim=1),
        **{f"pass@{k}": pass_at_k(samples, correct.sum(dim=2), k).mean(dim=1) for k in sorted({1, samples})},
    }
    values = torch.stack(list(columns.values()), dim=1).tolist()  # [R, K]
    # an episode's numbers (turns, tool calls, truncated) on the greedy episodes (environment tasks, R = 1)
    episodes = {f"greedy_{k}": v for k, v in Grades.cat(list(greedy)).metrics.items() if k.startswith("episode/")}
    prompts, responses, grades = first
    m = len(prompts)
    if grades.prompts is not None:  # as graded: an environment's starts become their episodes' prompts
        prompts = grades.prompts[:m]
    out = []
    for r, row in enumerate(values):
        rows = slice(r * m, (r + 1) * m)  # run r's responses to the first chunk
        notes = None if grades.notes is None else grades.notes[rows]
        table = sample_table(prompts, responses[rows], Grades(grades.rewards[rows], grades.correct[rows], {},
                                                              notes=notes), epoch, step, table_rows)
        out.append([{"kind": "eval", "epoch": epoch, "step": step, **dict(zip(columns, row)), **episodes}, table])
    return out


def sample_table(prompts: Any, responses: Any, grades: Any, epoch: int, step: int, rows: int) -> Record:
    """The first ``rows`` eval prompts, one sampled response each, with reward and verdict.
    A prompt is kept as data (text, a chat's list of messages, the toy's numbers):
    ``rlvr.base.record.prompt_text`` renders it for samples.md and the report."""
    count = min(rows, len(prompts))
    rewards, correct = grades.rewards[:count, 0].tolist(), grades.correct[:count, 0].tolist()
    notes = getattr(grades, "notes", None)
    table = []
    for b in range(count):
        prompt = prompts[b]["prompt"] if isinstance(prompts[b], dict) else prompts[b]
        prompt = prompt.tolist() if torch.is_tensor(prompt) else prompt
        response = responses[b][0]
        if hasattr(response, "as_record"):  # an episode: its turns, roles and what was trained
            response = response.as_record()
        else:
            response = response if isinstance(response, str) else response.tolist()
        row = {"prompt": prompt, "response": response, "reward": rewards[b], "correct": bool(correct[b])}
        if notes is not None and notes[b][0]:
            row["note"] = notes[b][0]  # what the rewards said of it (a judge's reply)
        table.append(row)
    return {"kind": "samples", "epoch": epoch, "step": step, "rows": table}
