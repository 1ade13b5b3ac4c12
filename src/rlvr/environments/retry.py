"""Any single-turn task as a multi-turn episode: a wrong answer is told so and may be tried again, up to a number
of attempts.

The task's gold check grades each attempt: ``check(row, text) -> bool`` on the dataset row and one answer;
``GoldCheck`` makes one from a task's gold reward spec (whose 1.0 means right), so the arithmetic task wraps as::

    RetryEnvironment(gold_check(ArithmeticTask()), max_attempts=3)

A text prompt ``"12+7*3="`` and two attempts read ``"12+7*3=35 12+7*3=33"``: a wrong answer is followed by the
prompt again (a space before it), so the episode uses no character the task's own prompts do not; ``retry_text``
replaces that with any text.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rlvr.environments.base import Observation, Step
from rlvr.rewards import RewardSpec
from rlvr.rewards.calls import judge_values

Check = Callable[[dict[str, Any], str], bool]
RETRY_MESSAGE = "That is not right. Try again."  # the retry turn of a chat prompt, unless retry_text is given


@dataclass(frozen=True)
class GoldCheck:
    """``check(row, text)`` from a reward spec: its function called as a reward runner calls it on one completion
    (a chat row's as one assistant message), right when it scores exactly 1.0. An abstention or an invalid value
    is not right; an exception propagates (a broken check is a setup error, not a wrong answer). Called in this
    process, without the spec's time limit; a dataclass of module-level parts, so it pickles to rollout workers."""

    spec: RewardSpec

    def __call__(self, row: dict[str, Any], text: str) -> bool:
        prompt = row["prompt"]
        completion: Any = [{"role": "assistant", "content": text}] if isinstance(prompt, list) else text
        columns = {key: [value] for key, value in row.items() if key != "prompt"}
        returned = self.spec.fn(prompts=[prompt], completions=[completion], **columns)
        kind, value, _, _ = judge_values(returned, 1)[0]
        return kind == "scored" and value == 1.0


def gold_check(task: Any) -> GoldCheck:
    """The gold check of a graded task (``reward_specs()`` and ``gold_reward``); ValueError when it has none."""
    name = getattr(task, "gold_reward", None)
    specs = [spec for spec in task.reward_specs() if spec.name == name] if name is not None else []
    if not specs:
        raise ValueError(f"task {getattr(task, 'name', type(task).__name__)!r} has no gold check to retry against")
    return GoldCheck(specs[0])


class RetryEnvironment:
    """A single-turn task with up to ``max_attempts`` answers. The gold check: an attempt was right.

    reset(row): the task's prompt dict; the first observation is its "prompt". step(text): ``check(row, text)``:
      * right: done, solved, reward ``max(0, 1 - penalty * (attempt - 1))`` (1.0 with the default ``penalty=0``);
      * wrong, attempts left: reward 0; the observation is ``retry_text``, or by default the prompt again after
        a space (a text prompt) or a user message ``RETRY_MESSAGE`` (a chat prompt);
      * wrong at the last attempt: done, unsolved, reward 0.
    """

    def __init__(self, check: Check, max_attempts: int = 3, penalty: float = 0.0,
                 retry_text: str | None = None) -> None:
        if max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {max_attempts}")
        if not 0.0 <= penalty <= 1.0:
            raise ValueError(f"penalty must be in [0, 1], got {penalty}")
        self.check, self.max_attempts, self.penalty, self.retry_text = check, max_attempts, penalty, retry_text
        self.row: dict[str, Any] | None = None
        self.attempts = 0
        self.done = False

    def tools(self) -> dict[str, Callable[..., Any]]:
        return {}

    def reset(self, start: Any) -> Observation:
        if not isinstance(start, dict) or not isinstance(start.get("prompt"), (str, list)):
            raise ValueError(f"a retry episode starts from a task's row with a 'prompt', got {start!r:.80}")
        self.row, self.attempts, self.done = start, 0, False
        return start["prompt"]

    def step(self, text: str) -> Step:
        if self.row is None or self.done:
            raise RuntimeError("step() needs an episode in progress: call reset() first")
        self.attempts += 1
        if self.check(self.row, text):
            self.done = True
            return Step(None, max(0.0, 1.0 - self.penalty * (self.attempts - 1)), done=True, solved=True)
        if self.attempts >= self.max_attempts:
            self.done = True
            return Step(None, 0.0, done=True, solved=False)
        return Step(self._retry_observation(), solved=False)

    def _retry_observation(self) -> Observation:
        prompt = self.row["prompt"]
        if isinstance(prompt, list):
            return [{"role": "user", "content": self.retry_text or RETRY_MESSAGE}]
        return " " + prompt if self.retry_text is None else self.retry_text

    def demonstration(self, row: dict[str, Any], attempts: list[str], turn_end: str = "") -> list[tuple[str, str]]:
        """The (prompt, completion) pairs of an episode of text ``row`` answered with ``attempts`` in turn (a
        plausible wrong answer, then the gold one), ``turn_end`` after each earlier attempt inside a prompt (as
        in ``rlvr.environments.games``); ValueError when the attempts do not end the episode exactly."""
        env = RetryEnvironment(self.check, self.max_attempts, self.penalty, self.retry_text)
        transcript = env.reset(row)
        if not isinstance(transcript, str):
            raise ValueError("demonstrations are text transcripts; this row's prompt is a message list")
        pairs = []
        for number, attempt in enumerate(attempts, start=1):
            pairs.append((transcript, attempt))
            step = env.step(attempt)
            if step.done:
                if number < len(attempts):
                    raise ValueError(f"the episode ended at attempt {number} of the {len(attempts)} given")
                return pairs
            transcript += attempt + turn_end + step.observation
        raise ValueError(f"{len(attempts)} attempts leave the episode running (max_attempts {self.max_attempts})")
