"""Evaluation on the task's fixed eval prompts (held-out ones, or the training prompts in the lecture's setting): solve
rates, rewards, pass@k, a samples table."""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Sequence
from typing import Any

import torch
from tqdm import tqdm

from rlvr.batch.interfaces import Policy, Task
from rlvr.batch.record import Record
from rlvr.batch.rollout import Grades
from rlvr.config import Config
from rlvr.rewards import TrainerState


def pass_at_k(num_samples: int, num_correct: torch.Tensor, k: int) -> torch.Tensor:
    """Unbiased pass@k from n samples with c correct, per prompt (counts of any shape): 1 - C(n-c, k) / C(n, k),
    computed as the stable product C(n-c, k) / C(n, k) = prod_{i=n-c+1}^{n} (1 - k / i)."""
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
    """What the evaluation is on, for figures and tables: "training prompts" when the task evaluates the prompts it
    trains on (the sorting task with fixed ``task.options.prompts``, the lecture's setting), else "held-out prompts"."""
    if config.task.name == "sorting" and config.task.options.prompts is not None:
        return "training prompts"
    return "held-out prompts"


@torch.no_grad()
def evaluate(config: Config, task: Task, policy: Policy, epoch: int, step: int) -> list[Record]:
    """Greedy and sampled solve rate, pass@k and mean reward on the task's fixed eval prompts (``eval_prompts_label``
    says whether they are held out). Returns the eval record and a "samples" record (a few prompts with their sampled
    responses and rewards, for a person to read). Prompts go through the policy ``log.eval_batch_size`` at a time;
    more than one chunk (minutes for an LM on a CPU, where no progress bar moves) says on stderr when it starts and
    ends."""
    prompts = task.eval_prompts()
    n, size = config.log.eval_samples, config.log.eval_batch_size
    what, started, chunks = f"{len(prompts)} {eval_prompts_label(config)}", time.monotonic(), -(-len(prompts) // size)
    if chunks > 1:
        _say(f"evaluating {what} (greedy and {n} sampled responses each, {size} prompts at a time)")
    # A separate generator: evaluation must not change the training random stream.
    gen = torch.Generator().manual_seed(config.seed + 1_000_003 + epoch)
    greedy, sampled, first = [], [], None
    state = TrainerState(step, epoch, config.algo.epochs * config.algo.inner_steps)  # reward functions' trainer_state
    for start in range(0, len(prompts), size):
        chunk = prompts[start : start + size]
        greedy.append(task.grade(chunk, policy.greedy(chunk), trainer_state=state))
        samples = policy.sample(chunk, n, config.policy.temperature, gen)
        sampled.append(task.grade(chunk, samples.responses, completion_ids=samples.completion_ids(),
                                  trainer_state=state))
        first = first or (chunk, samples.responses, sampled[-1])
    records = eval_records(greedy, sampled, first, n, epoch, step, config.log.table_rows)
    if chunks > 1:
        _say(f"evaluated {what} in {time.monotonic() - started:.1f} s: greedy solve rate "
             f"{records[0]['greedy_solve_rate']:.3f}")
    return records


def _say(line: str) -> None:
    """One line on stderr, written past a progress bar when one is drawn (tqdm's write)."""
    tqdm.write(f"rlvr: {line}", file=sys.stderr)


def eval_records(greedy: Sequence[Grades], sampled: Sequence[Grades], first: tuple[Any, Any, Grades],
                 samples: int, epoch: int, step: int, table_rows: int) -> list[Record]:
    """The eval record and samples record from the graded chunks: greedy [M, 1] and sampled [M, S] per chunk; ``first``
    the first chunk's prompts [M], responses and sampled grades."""

    def joined(grades: Sequence[Grades], key: str) -> torch.Tensor:  # [B, k]
        return torch.cat([getattr(g, key) for g in grades])

    correct, greedy_rewards = joined(sampled, "correct"), joined(greedy, "rewards")  # [B, S], [B, 1]
    columns = {
        "greedy_solve_rate": joined(greedy, "correct").float().mean(),
        "greedy_reward": greedy_rewards.nanmean(),
        "sampled_solve_rate": correct.float().mean(),
        "sampled_reward": joined(sampled, "rewards").nanmean(),
        **{f"pass@{k}": pass_at_k(samples, correct.sum(dim=1), k).mean() for k in sorted({1, samples})},
    }
    values = torch.stack(list(columns.values())).tolist()  # one conversion to Python
    # an episode's numbers (turns, tool calls, truncated) on the greedy episodes (environment tasks)
    episodes = {f"greedy_{k}": v for k, v in Grades.cat(list(greedy)).metrics.items() if k.startswith("episode/")}
    prompts, responses, grades = first
    if grades.prompts is not None:  # as graded: an environment's starts become their episodes' prompts
        prompts = grades.prompts[:len(prompts)]
    table = sample_table(prompts, responses, grades, epoch, step, table_rows)
    return [{"kind": "eval", "epoch": epoch, "step": step, **dict(zip(columns, values)), **episodes}, table]


def sample_table(prompts: Any, responses: Any, grades: Any, epoch: int, step: int, rows: int) -> Record:
    """The first ``rows`` eval prompts, one sampled response each, with reward and verdict; a prompt is kept as data
    (``rlvr.batch.record.prompt_text`` renders it)."""
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
