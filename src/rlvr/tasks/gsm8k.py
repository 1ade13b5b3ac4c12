"""GSM8K grade-school math word problems, graded with math-verify.

Data: JSON Lines with ``question`` and ``answer`` (a worked solution ending ``#### <number>``); prompt templates
``r1_zero`` and ``plain``. Rewards (TRL form): the required ``answer_reward``, under the ``RewardRunner`` timeout
instead of math-verify's SIGALRM ones, and ``format_reward`` (docs/explanation/tasks.md)."""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Any

import torch

from rlvr.base.data import read_jsonl
from rlvr.base.rules import option
from rlvr.rewards import RewardSpec
from rlvr.rewards.verifiers import is_equivalent, math_verify
from rlvr.tasks.dataset import RowsTask
from rlvr.tasks.grading import Prompt
from rlvr.tasks.text import resolve_weights

TEMPLATES = {
    "r1_zero": (
        "A conversation between User and Assistant. The User asks a question, and the "
        "Assistant solves it. The Assistant first thinks about the reasoning process in the "
        "mind and then provides the User with the answer. The reasoning process is enclosed "
        "within <think> </think> and answer is enclosed within <answer> </answer> tags, "
        "respectively, i.e., <think> reasoning process here </think> <answer> answer here "
        "</answer>.\nUser: {question}\nAssistant: <think>"
    ),
    "plain": "Question: {question}\nAnswer:",
}

_FINAL_ANSWER = re.compile(r"####\s*(-?[0-9][0-9,]*(?:\.[0-9]+)?)\s*\Z")
_CALCULATOR = re.compile(r"<<[^<>]*>>")  # GSM8K's calculator annotations, "<<2*3=6>>"
_R1_ZERO = re.compile(r".*</think>\s*<answer>(.*)</answer>\s*", re.DOTALL)


def extract_answer(completion: str, template: str = "r1_zero") -> str | None:
    """The final answer X of a completion, or None when it is not in the template's form: r1_zero's
    "reasoning </think> <answer> X </answer>" (one answer block, at the end), plain's "reasoning #### X"."""
    if template == "r1_zero":
        once = all(completion.count(tag) == 1 for tag in ("</think>", "<answer>", "</answer>"))
        match = _R1_ZERO.fullmatch(completion) if once else None
        answer = "" if match is None else match[1].strip()
    elif template == "plain":
        _, marker, tail = completion.rpartition("####")
        answer = tail.strip().split("\n", 1)[0].strip() if marker else ""
    else:
        raise ValueError(f"unknown template {template!r}; allowed: {', '.join(TEMPLATES)}")
    return answer or None


def answer_reward(
    prompts: list[str], completions: list[str], answer: list[str], template: str = "r1_zero",
    **kwargs: Any,
) -> list[float | None]:
    """1.0 when the final answer equals the gold ``answer`` under math-verify, 0.0 when it differs or is missing,
    None when the gold does not parse. [N]"""
    rewards: list[float | None] = []
    for completion, gold in zip(completions, answer):
        extracted = extract_answer(completion, template)
        same = False if extracted is None else is_equivalent(extracted, gold)
        rewards.append(None if same is None else float(same))
    return rewards


def format_reward(
    prompts: list[str], completions: list[str], template: str = "r1_zero", **kwargs: Any
) -> list[float]:
    """1.0 when the completion has the template's final-answer form, else 0.0. [N]"""
    return [float(extract_answer(c, template) is not None) for c in completions]


def load_gsm8k(path: str | Path) -> list[dict[str, str]]:
    """GSM8K records: ``question``, ``solution`` (without the final line and calculator annotations) and
    ``answer`` (the final number, commas removed); DataError for a row without a final ``#### <number>``."""
    rows = read_jsonl(path, {"question": str, "answer": str}, check=_check_final_answer)
    records = []
    for row in rows:
        match = _FINAL_ANSWER.search(row["answer"])
        solution = _CALCULATOR.sub("", row["answer"][: match.start()]).strip()
        records.append(
            {"question": row["question"], "solution": solution, "answer": match[1].replace(",", "")}
        )
    return records


def _check_final_answer(row: dict[str, Any]) -> None:
    if _FINAL_ANSWER.search(row["answer"]) is None:
        raise ValueError(f"answer does not end with '#### <number>': ...{row['answer'][-40:]!r}")


DEFAULT_WEIGHTS = {"answer": 1.0, "format": 0.1}


class Gsm8kTask(RowsTask):
    """GSM8K: training prompts from ``train_path``, the fixed eval set from ``eval_path``. Prompt dicts: "prompt",
    "answer" (gold number), "solution" (for SFT). ``close()`` it (or use ``with``) to stop its graders.
    """

    name = "gsm8k"
    gold_reward = "answer"
    options = {
        "train_path": option("GSM8K JSON Lines of the training problems"),
        "eval_path": option("GSM8K JSON Lines of the held-out problems"),
        "template": option("prompt template", choices=TEMPLATES),
        "num_eval": option("the first num_eval held-out problems (null: all)", min=1),
        "grader_timeout": option("seconds math-verify may spend on one completion", above=0),
        "weights": option("reward weights by name, over the defaults (answer 1, format 0.1)"),
        "num_workers": option("grader processes (null: rewards.num_workers)", min=1, max=256),
    }

    def __init__(
        self,
        train_path: str | Path,
        eval_path: str | Path,
        template: str = "r1_zero",
        num_eval: int | None = None,
        grader_timeout: float = 5.0,
        weights: dict[str, float] | None = None,
        num_workers: int | None = None,
    ) -> None:
        if template not in TEMPLATES:
            raise ValueError(f"unknown template {template!r}; allowed: {', '.join(TEMPLATES)}")
        # here, not in the graders' first call: a missing math-verify fails before any work, and forked
        # graders inherit the module instead of importing it within their time limit
        math_verify()
        self.template = template
        self._train = [self._prompt(record) for record in load_gsm8k(train_path)]
        self._eval = [self._prompt(record) for record in load_gsm8k(eval_path)][:num_eval]
        self.weights = resolve_weights(DEFAULT_WEIGHTS, weights)
        self.grader_timeout = grader_timeout
        self.reward_workers = num_workers

    def reward_specs(self) -> list[RewardSpec]:
        return [
            RewardSpec(
                functools.partial(answer_reward, template=self.template),
                self.weights["answer"], "answer", timeout=self.grader_timeout, required=True,
            ),
            RewardSpec(functools.partial(format_reward, template=self.template), self.weights["format"], "format"),
        ]

    def sample_prompts(self, num_prompts: int, generator: torch.Generator) -> list[Prompt]:
        """``num_prompts`` distinct training problems (same generator state, same problems)."""
        if num_prompts > len(self._train):
            raise ValueError(f"asked for {num_prompts} prompts; the training set has {len(self._train)}")
        order = torch.randperm(len(self._train), generator=generator)[:num_prompts]
        return [self._train[i] for i in order.tolist()]

    def sft_completion(self, prompt: Prompt) -> str:
        """The worked solution and answer in the template's form."""
        if self.template == "r1_zero":
            return f" {prompt['solution']} </think> <answer> {prompt['answer']} </answer>"
        return f" {prompt['solution']}\n#### {prompt['answer']}"

    def _prompt(self, record: dict[str, str]) -> Prompt:
        text = TEMPLATES[self.template].format(question=record["question"])
        return {"prompt": text, "answer": record["answer"], "solution": record["solution"]}
