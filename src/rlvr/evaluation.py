"""Evaluation on the task's fixed eval prompts (held-out ones, or the training prompts in
the lecture's setting): solve rates, rewards, pass@k, a samples table."""

from __future__ import annotations

import math
from typing import Any

import torch

from rlvr.config import Config
from rlvr.metrics import Record
from rlvr.rewards import TrainerState
from rlvr.rollout import Policy, Task


def pass_at_k(num_samples: int, num_correct: torch.Tensor, k: int) -> torch.Tensor:
    """Unbiased pass@k from n samples with c correct: 1 - C(n-c, k) / C(n, k), per prompt.

    num_correct: [B] counts -> [B] float. Computed as a stable product:
    C(n-c, k) / C(n, k) = prod_{i=n-c+1}^{n} (1 - k / i).
    """
    n = num_samples
    if not 1 <= k <= n:
        raise ValueError(f"pass@{k} needs 1 <= k <= n={n}")
    out = []
    for c in num_correct.tolist():
        if n - c < k:
            out.append(1.0)
        else:
            out.append(1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1)))
    return torch.tensor(out)


def eval_prompts_label(config: Config) -> str:
    """What the evaluation is on, for figures and tables: "training prompts" when the
    task evaluates the prompts it trains on (the sorting task with fixed ``task.prompts``,
    the lecture's setting: its solve rate says nothing about prompts it has not seen),
    else "held-out prompts"."""
    if config.task.name == "sorting" and config.task.prompts is not None:
        return "training prompts"
    return "held-out prompts"


@torch.no_grad()
def evaluate(config: Config, task: Task, policy: Policy, epoch: int, step: int) -> list[Record]:
    """Greedy and sampled solve rate, pass@k and mean reward on the task's fixed eval
    prompts (``eval_prompts_label`` says whether they are held out).

    Prompts go through the policy ``log.eval_batch_size`` at a time (a real LM cannot
    decode a whole validation set at once). Returns the eval record and a "samples"
    record (a few prompts with their sampled responses and rewards, for a person to read).
    """
    prompts = task.eval_prompts()
    n, size = config.log.eval_samples, config.log.eval_batch_size
    # A separate generator: evaluation must not change the training random stream.
    gen = torch.Generator().manual_seed(config.seed + 1_000_003 + epoch)
    greedy, sampled, first = [], [], None
    state = TrainerState(step, epoch, config.algo.epochs * config.algo.inner_steps)  # reward functions' trainer_state
    for start in range(0, len(prompts), size):
        chunk = prompts[start : start + size]
        greedy.append(task.grade(chunk, policy.greedy(chunk), trainer_state=state))
        samples = policy.sample(chunk, n, config.policy.temperature, gen)
        responses = samples.responses
        sampled.append(task.grade(chunk, responses, completion_ids=samples.completion_ids(), trainer_state=state))
        first = first or (chunk, responses, sampled[-1])
    greedy_rewards, greedy_correct = (torch.cat([getattr(g, k) for g in greedy]) for k in ("rewards", "correct"))
    rewards, correct = (torch.cat([getattr(g, k) for g in sampled]) for k in ("rewards", "correct"))  # [B, n]
    record = {
        "kind": "eval",
        "epoch": epoch,
        "step": step,
        "greedy_solve_rate": greedy_correct.float().mean().item(),
        "greedy_reward": greedy_rewards.nanmean().item(),
        "sampled_solve_rate": correct.float().mean().item(),
        "sampled_reward": rewards.nanmean().item(),
    }
    for k in sorted({1, n}):
        record[f"pass@{k}"] = pass_at_k(n, correct.sum(dim=1), k).mean().item()
    return [record, sample_table(*first, epoch, step, config.log.table_rows)]


def sample_table(prompts: Any, responses: Any, grades: Any, epoch: int, step: int, rows: int) -> Record:
    """The first ``rows`` eval prompts, one sampled response each, with reward and verdict.
    A prompt is kept as data (text, a chat's list of messages, the toy's numbers):
    ``rlvr.metrics.prompt_text`` renders it for samples.md and the report."""
    table = []
    for b in range(min(rows, len(prompts))):
        prompt = prompts[b]["prompt"] if isinstance(prompts[b], dict) else prompts[b]
        prompt = prompt.tolist() if torch.is_tensor(prompt) else prompt
        response = responses[b][0]
        response = response if isinstance(response, str) else response.tolist()
        table.append({"prompt": prompt, "response": response,
                      "reward": grades.rewards[b, 0].item(), "correct": bool(grades.correct[b, 0])})
    return {"kind": "samples", "epoch": epoch, "step": step, "rows": table}
