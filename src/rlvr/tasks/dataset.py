"""Your own data: prompts (and gold answers) from a file, rewards from verifiers or your functions.

``task.name: dataset`` reads ``path``: JSON Lines (.jsonl), a JSON list of objects
(.json), CSV (.csv, every value a string), Parquet (.parquet), or a folder written by
Hugging Face ``datasets``' ``save_to_disk``. Each row's ``prompt_column`` is text or a
chat (a list of ``{"role", "content"}`` messages), rendered by the policy with its
tokenizer's chat template (``rlvr.policies.prompts``); ``system_prompt`` is prepended to
every prompt as a system message (a text prompt then becomes the user message).

Every other column reaches every reward function by its name, as TRL passes them
(``fn(prompts, completions, **columns)``; ``prompts`` are the texts or chats). A column
missing from some rows is None there, as ``datasets`` fills it.

The task's only built-in reward is the gold check, given ``answer_column``: ``gold``
math (``rlvr.rewards.verifiers.math_answer``, under ``grader_timeout``), exact or
numeric, on the answer ``extract`` finds (``rlvr.rewards.verifiers.EXTRACTORS``). It is
required: a completion it does not grade gets no reward. Without it, reward functions
must come from ``rewards.functions``, and nothing counts as solved.

Held out: the rows of ``eval_path``, or the fraction ``eval_fraction`` of ``path``
(default 0.1 without ``eval_path``) picked by ``eval_seed``; training never draws them.
Training order: ``PassOrder``.

Every problem with a file is a DataError naming ``file:line`` (JSON Lines, CSV, a JSON
syntax error) or ``file: row i`` (1-based), raised while the task is built, before the
model loads.
"""

from __future__ import annotations

import csv
import functools
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rlvr.data import DataError, read_jsonl
from rlvr.rewards import RewardSpec
from rlvr.rewards.verifiers import EXTRACTORS, exact_match, math_answer, numeric_match
from rlvr.tasks.grading import Prompt
from rlvr.tasks.text import TextTask

GOLD_CHECKS = {"math": math_answer, "exact": exact_match, "numeric": numeric_match}
RESERVED = ("prompts", "completions")  # the reward functions' own arguments
SUFFIXES = (".jsonl", ".json", ".csv", ".parquet")
_POSITION_BITS = 32  # the generator's seed keeps the data position above these bits


class PassOrder:
    """Training rows in a fresh random order each pass over the data, resumable from the
    run's generator alone.

    The rows drawn form one stream: pass p is a permutation of the n rows seeded by
    (seed, p), and a call takes the next ``num`` positions of the stream (a batch may
    span two passes). Where the stream is lives in the generator itself, the only state
    a checkpoint restores and a Ray rollout worker receives: its seed's bits above 32
    hold the position. After a call the generator is reseeded with (position << 32) | u,
    u a 32-bit number drawn from it (torch's Mersenne Twister is seeded by the low 32
    bits, so the stream that follows is u's); ``initial_seed()`` is restored with the
    generator's state, so a resumed run draws what an uninterrupted one draws. A run's
    first generator, seeded with ``seed`` < 2**32, is at position 0. A generator seeded
    afresh for each batch (Ray rollout with max_staleness > 0: from (seed, epoch)) starts
    at a position its seed picks: its batches are windows at random places of the stream.
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


def read_rows(path: str | Path, check: Any = None) -> list[tuple[str, dict[str, Any]]]:
    """(where, row) of every row of a data file or ``save_to_disk`` folder, in order;
    ``check(row)`` raising ValueError becomes a DataError at ``where``. DataError for a
    missing path, an unknown suffix, bad syntax, a row that is not an object, no rows."""
    path = Path(path)
    if path.is_dir():
        rows = [(f"{path}: row {i + 1}", row) for i, row in enumerate(_read_saved_dataset(path))]
    elif not path.is_file():
        raise DataError(f"{path}: no such file or folder")
    elif path.suffix == ".jsonl":
        records = read_jsonl(path, {}, check=check)  # checks each row where its line is known
        return [(str(path), row) for row in records]
    elif path.suffix == ".json":
        rows = _read_json(path)
    elif path.suffix == ".csv":
        rows = _read_csv(path)
    elif path.suffix == ".parquet":
        import pyarrow.parquet as pq

        rows = [(f"{path}: row {i + 1}", row) for i, row in enumerate(pq.read_table(path).to_pylist())]
    else:
        raise DataError(f"{path}: unknown file type {path.suffix!r}; expected {', '.join(SUFFIXES)} "
                        "or a folder written by datasets' save_to_disk")
    if not rows:
        raise DataError(f"{path}: empty; expected at least one row")
    for where, row in rows:
        if check is not None:
            try:
                check(row)
            except ValueError as err:
                raise DataError(f"{where}: {err}") from err
    return rows


def _read_saved_dataset(path: Path) -> list[dict[str, Any]]:
    import datasets

    try:
        data = datasets.load_from_disk(str(path))
    except FileNotFoundError as err:
        raise DataError(f"{path}: not a folder written by datasets' save_to_disk ({err})") from err
    if isinstance(data, datasets.DatasetDict):
        raise DataError(f"{path}: holds the splits {', '.join(data)}; give one split's folder, e.g. {path / 'train'}")
    return data.to_list()


def _read_json(path: Path) -> list[tuple[str, dict[str, Any]]]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise DataError(f"{path}:{err.lineno}: invalid JSON ({err.msg} at column {err.colno})") from err
    except UnicodeDecodeError as err:
        raise DataError(f"{path}: not valid UTF-8 ({err.reason} at byte {err.start})") from err
    if not isinstance(data, list):
        raise DataError(f"{path}: expected a JSON list of objects, got {type(data).__name__}")
    for i, row in enumerate(data):
        if not isinstance(row, dict):
            raise DataError(f"{path}: row {i + 1}: expected a JSON object, got {type(row).__name__}")
    return [(f"{path}: row {i + 1}", row) for i, row in enumerate(data)]


def _read_csv(path: Path) -> list[tuple[str, dict[str, Any]]]:
    rows = []
    with path.open(newline="", encoding="utf-8") as file:
        reader = csv.DictReader(file)
        for row in reader:
            where = f"{path}:{reader.line_num}"
            if None in row:
                raise DataError(f"{where}: more values than the header's {len(reader.fieldnames or [])} columns")
            rows.append((where, row))
    return rows


class RowsTask(TextTask):
    """A text task whose prompts are two fixed lists of rows, ``_train`` and ``_eval``,
    drawn in the run's pass order (``order``: a ``PassOrder`` over ``_train``)."""

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
    """Rows of your own file as prompts (see the module docstring for every option).

    Prompt dicts: "prompt" (text or chat) and every other column by its name.
    """

    name = "dataset"
    no_reward_hint = "task.options.answer_column is not set"

    def __init__(
        self,
        path: str | Path,
        prompt_column: str = "prompt",
        system_prompt: str | None = None,
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
        if gold == "math" and answer_column is not None:
            from rlvr.tasks.gsm8k import math_verify

            math_verify()  # missing math-verify fails now; forked graders inherit the module
        self.prompt_column, self.system_prompt, self.answer_column = prompt_column, system_prompt, answer_column
        self.gold_reward = None if answer_column is None else "gold"
        self._gold = functools.partial(gold_check, check=GOLD_CHECKS[gold], column=answer_column, extract=extract)
        self.grader_timeout = grader_timeout if gold == "math" else None  # exact and numeric are cheap
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
        self._train, self._eval = train, held_out[:num_eval]
        self.order = PassOrder(len(train), shuffle_seed)

    def reward_specs(self) -> list[RewardSpec]:
        if self.answer_column is None:
            return []
        return [RewardSpec(self._gold, 1.0, "gold", timeout=self.grader_timeout, required=True)]

    def sft_completion(self, prompt: Prompt) -> str:
        if self.answer_column is None:
            raise ValueError("SFT on the dataset task needs task.options.answer_column")
        return str(prompt[self.answer_column])

    def _load(self, path: str | Path) -> list[Prompt]:
        """The prompt dicts of one file, every row with the same keys (missing columns None)."""
        rows = read_rows(path, check=self._check_row)
        columns = list(dict.fromkeys(key for _, row in rows for key in row))
        clash = [c for c in columns if c in RESERVED or (c == "prompt" and self.prompt_column != "prompt")]
        if clash:
            raise DataError(f"{path}: column {clash[0]!r} clashes with the reward functions' arguments "
                            f"(prompts, completions) or the prompt; rename it")
        others = [c for c in columns if c != self.prompt_column]
        return [{"prompt": self._prompt(row[self.prompt_column]), **{c: row.get(c) for c in others}}
                for _, row in rows]

    def _prompt(self, value: str | list) -> str | list[dict[str, Any]]:
        if self.system_prompt is None:
            return value
        messages = [{"role": "user", "content": value}] if isinstance(value, str) else list(value)
        return [{"role": "system", "content": self.system_prompt}, *messages]

    def _check_row(self, row: dict[str, Any]) -> None:
        """ValueError for a row without a usable prompt or gold answer."""
        for column in (self.prompt_column, self.answer_column):
            if column is not None and row.get(column) is None:
                found = ", ".join(map(str, row)) or "no columns"
                raise ValueError(f"missing column {column!r} (found {found})")
        check_prompt_value(row[self.prompt_column], self.prompt_column, self.system_prompt is not None)


def check_prompt_value(value: Any, column: str, adds_system: bool) -> None:
    """ValueError unless ``value`` is non-empty text or a non-empty list of {"role": str,
    "content": str} messages (no system message of its own when ``adds_system``)."""
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


def gold_check(completions: list[str], check: Any, column: str, extract: str, **columns: Any
               ) -> list[float | None]:
    """The dataset task's gold reward: ``check`` (a verifier) of the completions against
    the gold column ``column``, found by ``extract``. [N]"""
    return check(completions=completions, answer=columns[column], extract=extract)
