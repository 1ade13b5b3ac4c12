"""Procedurally generated reasoning problems from the ``reasoning-gym`` package, offline.

``task.name: reasoning_gym`` with ``task.options.dataset`` a generator name, ``size`` training and ``eval_size``
held-out problems (seeds ``data_seed`` and ``data_seed + 1``). Reward: each problem's own scorer, in a reward worker
under ``grader_timeout``, on the answer ``extract`` finds (docs/explanation/tasks.md)."""

from __future__ import annotations

import functools
from typing import Any

from rlvr.base.errors import did_you_mean
from rlvr.base.rules import SEED_MAX, option
from rlvr.rewards import RewardSpec
from rlvr.rewards.verifiers import EXTRACTORS, extract_answer
from rlvr.tasks.dataset import PassOrder, RowsTask
from rlvr.tasks.grading import Prompt
from rlvr.tasks.text import MAX_EVAL_PROMPTS


def score_reasoning_gym(completions: list[str], answer: list[str], question: list[str], metadata: list[dict],
                        generator: Any, extract: str = "answer_tag", **kwargs: Any) -> list[float]:
    """The generator's ``score_answer`` of each completion's extracted answer; 0.0 where none is found. [N]"""
    rewards = []
    for completion, gold, text, meta in zip(completions, answer, question, metadata):
        found = extract_answer(completion, extract)
        entry = {"question": text, "answer": gold, "metadata": meta}
        rewards.append(0.0 if found is None else float(generator.score_answer(found, entry)))
    return rewards


class ReasoningGymTask(RowsTask):
    """A reasoning-gym generator as a task (see the module docstring for the options)."""

    name = "reasoning_gym"
    gold_reward = "score"
    options = {
        "dataset": option("the reasoning-gym generator (basic_arithmetic, chain_sum, ...)"),
        "size": option("training problems generated", min=1, max=2**20),
        "eval_size": option("held-out problems generated", min=1, max=MAX_EVAL_PROMPTS),
        "data_seed": option("generator seed (the held-out set: data_seed + 1)", min=0, max=SEED_MAX - 1),
        "config": option("the generator's own settings"),
        "system_prompt": option("a name of reasoning_gym.utils.SYSTEM_PROMPTS or your own text (null: the bare "
                                "question as text)"),
        "extract": option("how the answer is found in a completion", choices=EXTRACTORS),
        "shuffle_seed": option("seed of the training order (default: the run's seed)", min=0, max=SEED_MAX),
        "grader_timeout": option("seconds each scorer call may take (null: no limit)", above=0),
    }

    def __init__(
        self,
        dataset: str,
        size: int = 1000,
        eval_size: int = 100,
        data_seed: int = 0,
        config: dict[str, Any] | None = None,
        system_prompt: str | None = "default",
        extract: str = "answer_tag",
        shuffle_seed: int = 0,
        grader_timeout: float | None = 5.0,
    ) -> None:
        import reasoning_gym
        from reasoning_gym.factory import DATASETS
        from reasoning_gym.utils import SYSTEM_PROMPTS

        if dataset not in DATASETS:
            raise ValueError(f"unknown reasoning-gym dataset {dataset!r}; {did_you_mean(dataset, sorted(DATASETS))}")
        if extract not in EXTRACTORS:
            raise ValueError(f"extract={extract!r} is not allowed; choose one of: {', '.join(EXTRACTORS)}")
        if size < 1 or eval_size < 1:
            raise ValueError(f"size and eval_size must be >= 1, got {size}, {eval_size}")
        self.system_prompt = SYSTEM_PROMPTS.get(system_prompt, system_prompt) if system_prompt else None
        settings = dict(config or {})
        held_out = reasoning_gym.create_dataset(dataset, size=eval_size, seed=data_seed + 1, **settings)
        self._eval = [self._prompt(entry) for entry in held_out]
        questions = {p["question"] for p in self._eval}
        train = reasoning_gym.create_dataset(dataset, size=size, seed=data_seed, **settings)
        self._train = [self._prompt(entry) for entry in train if entry["question"] not in questions]
        if not self._train:
            raise ValueError(f"every one of the {size} training problems is also held out; widen the generator")
        self.order = PassOrder(len(self._train), shuffle_seed)
        self._score = functools.partial(score_reasoning_gym, generator=train, extract=extract)
        self.grader_timeout = grader_timeout

    def reward_specs(self) -> list[RewardSpec]:
        return [RewardSpec(self._score, 1.0, "score", timeout=self.grader_timeout, required=True)]

    def sft_completion(self, prompt: Prompt) -> str:
        return f"<answer>{prompt['answer']}</answer>"

    def _prompt(self, entry: dict[str, Any]) -> Prompt:
        question = entry["question"]
        text: Any = question
        if self.system_prompt is not None:
            text = [{"role": "system", "content": self.system_prompt}, {"role": "user", "content": question}]
        return {"prompt": text, "answer": str(entry["answer"]), "question": question, "metadata": entry["metadata"]}
