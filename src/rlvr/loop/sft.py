"""Supervised warm start: train a causal LM on (prompt, completion) pairs.

The loss is the mean negative log-likelihood of completion tokens (EOS included), the prompt masked out. It is scored by
the policy's own ``log_probs`` at temperature 1, so SFT and RL see prompts tokenised and padded the same way. ``rlvr
sft`` writes the result with ``save_pretrained`` to ``RUN_DIR/model`` (``rlvr.runs.launch.run_sft``): point
``policy.options.model`` at it for RL.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from rlvr import core
from rlvr.base.data import DataError, read_jsonl_lines
from rlvr.batch.record import Record
from rlvr.batch.rollout import Samples
from rlvr.config import Config, ConfigError
from rlvr.config.compose import build_policy, build_task
from rlvr.loop.optim import build_optimizer, clear_grads
from rlvr.loop.state import seed_everything
from rlvr.tasks import check_prompts_fit


def load_pairs(config: Config, task: Any, generator: torch.Generator, chat: bool = False
               ) -> list[tuple[Any, str]]:
    """(prompt, completion) pairs: from ``sft.data`` (JSONL: rows of ``prompt`` and ``completion`` text, or whole
    episodes as ``messages``: see ``episode_pairs``) or the task's own demonstrations. ``chat``: the policy renders
    chats (a chat template)."""
    s = config.sft
    if s.data:
        pairs: list[tuple[Any, str]] = []
        for line, row in read_jsonl_lines(s.data, {}):
            where = f"{s.data}:{line}"
            if "messages" in row:
                pairs += episode_pairs(row["messages"], chat, getattr(task, "turn_end", ""), where)
            elif isinstance(row.get("prompt"), str) and isinstance(row.get("completion"), str):
                pairs.append((row["prompt"], row["completion"]))
            else:
                raise DataError(f"{where}: expected text columns 'prompt' and 'completion', or an episode's "
                                f"'messages' (found {', '.join(map(str, row)) or 'no columns'})")
        return pairs
    if not hasattr(task, "sft_examples"):
        raise ConfigError(f"task {config.task.name!r} has no SFT examples; set sft.data to a JSONL file of "
                          "'prompt' and 'completion' rows, or of episodes as 'messages' "
                          "(see docs/tutorials/environments.md)")
    return task.sft_examples(s.num_examples, generator)


def episode_pairs(messages: Any, chat: bool, turn_end: str, where: str) -> list[tuple[Any, str]]:
    """A demonstrated episode (``[{"role": ..., "content": ...}, ...]``, the first message a user's or system's) as one
    pair per assistant turn: (the episode before it, its content), as an episode feeds the policy. ``chat``: the episode
    so far as messages, rendered by the chat template; else its text, each assistant turn followed by ``turn_end`` (the
    EOS text, where a sampled turn ends) and the observations after it."""
    if not (isinstance(messages, list) and messages and all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
            for m in messages)):
        raise DataError(f"{where}: 'messages' must be a list of {{'role': ..., 'content': text}} objects")
    if messages[0]["role"] == "assistant":
        raise DataError(f"{where}: an episode starts with its prompt (a user or system message), not an "
                        "assistant turn")
    if not any(m["role"] == "assistant" for m in messages):
        raise DataError(f"{where}: the episode has no assistant turn to learn")
    pairs: list[tuple[Any, str]] = []
    text = ""
    for i, message in enumerate(messages):
        if message["role"] == "assistant":
            pairs.append(([dict(m) for m in messages[:i]] if chat else text, message["content"]))
            text += message["content"] + turn_end
        else:
            text += message["content"]
    return pairs


def encode_batch(policy: Any, pairs: list[tuple[str, str]]) -> Samples:
    """Prompts left-padded as for sampling; completions + EOS right-padded as responses."""
    prompt_ids, prompt_mask = policy.encode_prompts([p for p, _ in pairs])
    tokenizer = policy.tokenizer
    completions = [tokenizer(c, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id] for _, c in pairs]
    width = max(len(ids) for ids in completions)
    response_ids = torch.full((len(pairs), width), tokenizer.pad_token_id, dtype=torch.long)
    response_mask = torch.zeros((len(pairs), width), dtype=torch.bool)
    for row, ids in enumerate(completions):
        response_ids[row, : len(ids)] = torch.tensor(ids)
        response_mask[row, : len(ids)] = True
    device = prompt_ids.device
    response_mask = response_mask.to(device)
    return Samples(None, response_ids.to(device), response_mask, prompt_ids, prompt_mask, policy_mask=response_mask)


def train_sft(config: Config, on_record: Callable[[Record], None]) -> Any:
    """Train; give every step's record to ``on_record``; return the trained policy (a run directory's job keeps them:
    ``rlvr.runs.launch.run_sft``)."""
    s = config.sft
    if config.policy.name != "causal_lm":
        raise ConfigError("sft needs policy.name='causal_lm'")
    if config.torch_threads:
        torch.set_num_threads(config.torch_threads)
    generator = seed_everything(config.seed)
    task = build_task(config)
    policy = build_policy(config, task)  # an environment task: held-out accuracy on greedy episodes
    check_prompts_fit(task, policy)
    pairs = load_pairs(config, task, generator, chat=bool(getattr(policy.tokenizer, "chat_template", None)))
    if not pairs:
        raise ConfigError("sft: no training pairs")
    optimizer = build_optimizer(config.optim, [p for p in policy.module.parameters() if p.requires_grad], lr=s.lr)
    try:
        for step in range(s.steps):
            index = torch.randint(0, len(pairs), (s.batch_size,), generator=generator).tolist()
            batch = encode_batch(policy, [pairs[i] for i in index])
            log_probs, _ = policy.log_probs(batch, 1.0)  # [n, T]
            loss = -core.masked_mean(log_probs, batch.policy_mask)  # mean NLL per completion token
            clear_grads(optimizer)
            loss.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(policy.module.parameters(), s.max_grad_norm)
            optimizer.step()
            record: Record = {"kind": "sft", "step": step, "loss": loss.item(), "grad_norm": grad_norm.item()}
            if (step + 1) % s.eval_every == 0 or step + 1 == s.steps:
                record.update(held_out_accuracy(config, task, policy))
            on_record(record)
            if not math.isfinite(record["loss"]):
                raise ConfigError(f"sft: loss became {record['loss']} at step {step}; lower sft.lr")
    finally:
        task.close()
    return policy


@torch.no_grad()
def held_out_accuracy(config: Config, task: Any, policy: Any) -> Record:
    """Greedy exact accuracy on the first ``sft.eval_size`` held-out prompts."""
    prompts = task.eval_prompts()[: config.sft.eval_size]
    grades = task.grade(prompts, policy.greedy(prompts))
    return {"eval_greedy_solve_rate": grades.correct.float().mean().item()}
