"""Your own data: prompts (and gold answers) from a file, rewards from verifiers or your functions.

The design: ``docs/explanation/tasks.md`` (``rlvr.tasks.dataset``).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rlvr.base.data import DataError
from rlvr.base.rules import SEED_MAX, option
from rlvr.batch.interfaces import Policy
from rlvr.rewards import RewardSpec
from rlvr.rewards.runner import ARGUMENTS
from rlvr.rewards.verifiers import EXTRACTORS, exact_match, math_answer, numeric_match, parse_number
from rlvr.tasks.grading import Prompt
from rlvr.tasks.readers import read_rows
from rlvr.tasks.text import TextTask

GOLD_CHECKS = {"math": math_answer, "exact": exact_match, "numeric": numeric_match}
RESERVED = ARGUMENTS  # the reward functions' own arguments
_POSITION_BITS = 32  # the generator's seed keeps the data position above these bits


class PassOrder:
    """Training rows in a fresh random order each pass over the data, resumable from the run's generator alone.

    The rows drawn form one stream: pass p is a permutation of the n rows seeded by (seed, p), and a call takes the
    next ``num`` positions (a batch may span two passes). The position lives in the generator, the only state a
    checkpoint restores and a Ray rollout worker receives: its seed's bits above 32. After a call the generator is
    reseeded with (position << 32) | u, u a 32-bit number drawn from it (torch's Mersenne Twister is seeded by the
    low 32 bits); ``initial_seed()`` is restored with the generator's state, so a resumed run draws what an
    uninterrupted one draws. A generator seeded afresh for each batch (Ray rollout with max_staleness > 0) starts
    where its seed picks: its batches are windows at random places of the stream.
    """

    def __init__(self, num_rows: int, seed: int) -> None:
        if num_rows < 1:
            raise ValueError("no training rows")
        self.num_rows, self.seed = num_rows, seed

    def take(self, num: int, generator: torch.Generator) -> list[int]:
        """The next ``num`` row indices for ``generator``, which moves past them."""
        start = generator.initial_seed() >> _POSITION_BITS
        rows = [self.row_at(start + k) for k in range(num)]
        low = int(torch.randint(0, 2**_POSITION_BITS, (1,), generator=generator))
        end = (start + num) % 2**_POSITION_BITS  # wraps after 4e9 prompts: pass numbers restart
        generator.manual_seed((end << _POSITION_BITS) | low)
        return rows

    def row_at(self, position: int) -> int:
        """The row at ``position`` of the stream."""
        pass_index, at = divmod(position, self.num_rows)
        return self.permutation(pass_index)[at]

    @functools.lru_cache(maxsize=2)  # noqa: B019 (one order per task; a batch spans at most two passes)
    def permutation(self, pass_index: int) -> list[int]:
        """The order of pass ``pass_index``: a permutation of range(n) seeded by (seed, pass)."""
        (derived,) = np.random.SeedSequence([self.seed, pass_index]).generate_state(1, dtype=np.uint64)
        return torch.randperm(self.num_rows, generator=torch.Generator().manual_seed(int(derived))).tolist()


class RowsTask(TextTask):
    """A text task whose prompts are two fixed lists of rows, ``_train`` (drawn in ``order``) and ``_eval``."""

    _train: list[Prompt]
    _eval: list[Prompt]
    order: PassOrder

    def sample_prompts(self, num_prompts: int, generator: torch.Generator) -> list[Prompt]:
        """The next ``num_prompts`` training rows of the run's pass order (``PassOrder``)."""
        return [self._train[i] for i in self.order.take(num_prompts, generator)]

    def eval_prompts(self) -> list[Prompt]:
        return list(self._eval)

    def fixed_prompts(self) -> dict[str, list[Prompt]]:
        """Both sets, checked against the policy before any work (a chat needs a chat template)."""
        return {"training prompt": list(self._train), "eval prompt": self.eval_prompts()}


class DatasetTask(RowsTask):
    """Rows of your own file as prompts: "prompt" (text or chat) and every other column by its name."""

    name = "dataset"
    no_reward_hint = "task.options.answer_column is not set"
    options = {
        "path": option("the data: .jsonl, .json, .csv, .parquet or a datasets save_to_disk folder"),
        "prompt_column": option("the column holding each prompt (text or a chat)"),
        "system_prompt": option("a system message put before every prompt (null: none)"),
        "raw_text": option("keep text prompts as text where the model has a chat template (false: each becomes "
                           "one user message, rendered by the template)"),
        "answer_column": option("the gold answer's column (null: no gold check)"),
        "gold": option("the gold check", choices=GOLD_CHECKS),
        "extract": option("how the answer is found in a completion", choices=EXTRACTORS),
        "eval_path": option("held-out rows from this file (null: eval_fraction of path)"),
        "eval_fraction": option("held-out share of path's rows (default 0.1 without eval_path)", above=0, below=1),
        "eval_seed": option("seed of the eval_fraction split", min=0, max=SEED_MAX),
        "num_eval": option("the first num_eval held-out rows (null: all)", min=1),
        "shuffle_seed": option("seed of the training order (default: the run's seed)", min=0, max=SEED_MAX),
        "grader_timeout": option("seconds the math check may spend on one completion (null: no limit)", above=0),
    }

    def __init__(
        self,
        path: str | Path,
        prompt_column: str = "prompt",
        system_prompt: str | None = None,
        raw_text: bool = False,
        answer_column: str | None = None,
        gold: str = "math",
        extract: str = "auto",
        eval_path: str | Path | None = None,
        eval_fraction: float | None = None,
        eval_seed: int = 0,
        num_eval: int | None = None,
        shuffle_seed: int = 0,
        grader_timeout: float | None = 5.0,
    ) -> None:
        if gold not in GOLD_CHECKS:
            raise ValueError(f"gold={gold!r} is not allowed; choose one of: {', '.join(GOLD_CHECKS)}")
        if extract not in EXTRACTORS:
            raise ValueError(f"extract={extract!r} is not allowed; choose one of: {', '.join(EXTRACTORS)}")
        if eval_path is not None and eval_fraction is not None:
            raise ValueError("give eval_path or eval_fraction, not both")
        eval_fraction = 0.1 if eval_fraction is None and eval_path is None else eval_fraction
        if eval_fraction is not None and not 0 < eval_fraction < 1:
            raise ValueError(f"eval_fraction must be in (0, 1), got {eval_fraction}")
        if answer_column is not None and answer_column == prompt_column:
            raise ValueError(f"answer_column={answer_column!r} is the prompt column; the gold answers need a column "
                             "of their own")
        if gold == "math" and answer_column is not None:
            from rlvr.rewards.verifiers import math_verify

            math_verify()  # missing math-verify fails now; forked graders inherit the module
        self.prompt_column, self.system_prompt, self.answer_column = prompt_column, system_prompt, answer_column
        self.raw_text = raw_text
        self.gold, self.gold_reward = gold, None if answer_column is None else "gold"
        self._gold = GoldCheck(GOLD_CHECKS[gold], answer_column, extract)
        self.no_gold_hint = f"does task.options.answer_column={answer_column!r} hold answers gold={gold!r} can read?"
        self.grader_timeout = grader_timeout if gold == "math" else None  # exact and numeric are cheap
        self.data_files = tuple(Path(p) for p in (path, eval_path) if p is not None)
        train = self._load(path)
        if eval_path is not None:
            held_out = self._load(eval_path)
        else:
            count = max(1, math.floor(eval_fraction * len(train)))
            if count >= len(train):
                raise ValueError(f"eval_fraction={eval_fraction} of {len(train)} rows leaves none for training")
            order = torch.randperm(len(train), generator=torch.Generator().manual_seed(eval_seed)).tolist()
            held_out = [train[i] for i in sorted(order[:count])]
            train = [train[i] for i in sorted(order[count:])]
        held_out = held_out[:num_eval]
        self._train, self._eval = [row for _, row in train], [row for _, row in held_out]
        self._origins = {"training prompt": [where for where, _ in train],
                         "eval prompt": [where for where, _ in held_out]}
        self.order = PassOrder(len(train), shuffle_seed)

    def prompt_origin(self, what: str, index: int) -> str | None:
        """Where prompt ``index`` of ``fixed_prompts()[what]`` is (``file:line`` or ``file: row i``)."""
        return self._origins[what][index]

    def policy_for(self, policy: Policy) -> Policy:
        """``policy`` as it is. Where it has a chat template and ``raw_text`` is off, every text prompt becomes one
        user message from here on, and reward functions see chats (TRL's conversational form)."""
        if not self.raw_text and getattr(getattr(policy, "tokenizer", None), "chat_template", None):
            self._train, self._eval = _as_chats(self._train), _as_chats(self._eval)
        return policy

    def reward_specs(self) -> list[RewardSpec]:
        if self.answer_column is None:
            return []
        return [RewardSpec(self._gold, 1.0, "gold", timeout=self.grader_timeout, required=True)]

    def sft_completion(self, prompt: Prompt) -> str:
        if self.answer_column is None:
            raise ValueError("SFT on the dataset task needs task.options.answer_column")
        return str(prompt[self.answer_column])

    def _load(self, path: str | Path) -> list[tuple[str, Prompt]]:
        """(where, prompt dict) of every row of one file, every row with the same keys (missing columns None)."""
        rows = read_rows(path, check=self._check_row)
        columns = list(dict.fromkeys(key for _, row in rows for key in row))
        clash = [c for c in columns if c in RESERVED or (c == "prompt" and self.prompt_column != "prompt")]
        if clash:
            raise DataError(f"{path}: column {clash[0]!r} clashes with the reward functions' arguments "
                            f"({', '.join(ARGUMENTS)}) or the prompt; rename it")
        others = [c for c in columns if c != self.prompt_column]
        return [(where, {"prompt": self._prompt(row[self.prompt_column]), **{c: row.get(c) for c in others}})
                for where, row in rows]

    def _prompt(self, value: str | list) -> str | list[dict[str, Any]]:
        if self.system_prompt is None:
            return value
        messages = [{"role": "user", "content": value}] if isinstance(value, str) else list(value)
        return [{"role": "system", "content": self.system_prompt}, *messages]

    def _check_row(self, row: dict[str, Any]) -> None:
        """ValueError for a row without a usable prompt or gold answer."""
        for column in (self.prompt_column, self.answer_column):
            if column is not None and column in row and row[column] is None:
                raise ValueError(f"column {column!r} is null")
            if column is not None and column not in row:
                found = ", ".join(map(str, row)) or "no columns"
                raise ValueError(f"missing column {column!r} (found {found})")
        check_prompt_value(row[self.prompt_column], self.prompt_column, self.system_prompt is not None)
        if self.answer_column is not None:
            check_gold_value(row[self.answer_column], self.answer_column, self.gold)


def _as_chats(rows: list[Prompt]) -> list[Prompt]:
    """``rows`` with each text prompt as one user message (chats as they are)."""
    return [{**row, "prompt": [{"role": "user", "content": row["prompt"]}]} if isinstance(row["prompt"], str) else row
            for row in rows]


def check_prompt_value(value: Any, column: str, adds_system: bool) -> None:
    """ValueError unless ``value`` is non-empty text or a non-empty list of {"role": str, "content": str} messages
    (no system message of its own when ``adds_system``)."""
    if isinstance(value, str):
        if not value:
            raise ValueError(f"column {column!r} is empty")
        return
    if not isinstance(value, list) or not value:
        raise ValueError(f"column {column!r} should be text or a non-empty list of chat messages, "
                         f"got {type(value).__name__} {value!r:.60}")
    for k, message in enumerate(value):
        if not (isinstance(message, dict) and isinstance(message.get("role"), str)
                and isinstance(message.get("content"), str)):
            raise ValueError(f"column {column!r}, message {k}: expected {{'role': str, 'content': str}}, "
                             f"got {message!r:.60}")
    if adds_system and value[0]["role"] == "system":
        raise ValueError(f"column {column!r} has a system message of its own, and system_prompt adds another; "
                         "drop one")


def check_gold_value(value: Any, column: str, gold: str) -> None:
    """ValueError unless ``value`` is a gold answer ``gold`` can read: text not blank (for "numeric", a number),
    or a finite number."""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise ValueError(f"column {column!r} should hold a gold answer (text or a number), "
                         f"got {type(value).__name__} {value!r:.60}")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"column {column!r} holds {value!r}, not a gold answer")
    if isinstance(value, str) and not value.strip():
        raise ValueError(f"column {column!r} is empty")
    if gold == "numeric" and isinstance(value, str) and parse_number(value) is None:
        raise ValueError(f"column {column!r} holds {value!r:.60}, which gold='numeric' cannot read as a number")


@dataclasses.dataclass(frozen=True)
class GoldCheck:
    """The dataset task's gold reward [N]: ``check`` of the completions against the gold ``column``. Its settings
    are fields, not keywords of the call: a data column named ``check`` or ``column`` cannot replace them."""

    check: Callable[..., list[float | None]]
    column: str | None
    extract: str

    def __call__(self, completions: list[str], **columns: Any) -> list[float | None]:
        return self.check(completions=completions, answer=columns[self.column], extract=self.extract)
