"""Multi-turn episodes as a task: ``task.name: environment``.

The environment is a ready one by name (``rlvr.environments.games``) or the user's class (``environment_factory``:
an rlvr ``Environment`` or a TRL-style class). Episodes start from seeds or from the rows of ``data``; an episode's
reward is its return, the gold check whether the environment said it was solved. How failed episodes are counted:
docs/explanation/tasks.md."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch

from rlvr.base.data import read_jsonl
from rlvr.base.errors import ConfigError, RunError
from rlvr.base.rules import option
from rlvr.batch.interfaces import Policy
from rlvr.batch.rollout import Grades
from rlvr.environments.base import Environment, Episode
from rlvr.environments.episodes import EpisodeLimits
from rlvr.environments.workers import WORKERS, EnvironmentHosts
from rlvr.rewards import RewardSpec
from rlvr.tasks.grading import GradedTask

_TRAIN_SEEDS = 2**31  # training seeds are drawn from [eval_size, this)
logger = logging.getLogger(__name__)


def _episode(completion: Any) -> Episode:
    """The episode behind a completion (a chat's completion: one assistant message)."""
    if isinstance(completion, list):
        completion = completion[-1]["content"]
    return completion.episode


def episode_return(completions: Sequence[Any], **_: Any) -> list[float | None]:
    """The episode's return; None (abstain) for an episode its environment's failure ended (``Episode.error``)."""
    return [None if _episode(c).error else _episode(c).episode_return for c in completions]


def solved(completions: Sequence[Any], **_: Any) -> list[float]:
    """1.0 when the environment said the episode was solved (0.0 when it never said)."""
    return [float(bool(_episode(c).solved)) for c in completions]


class EpisodeTask(GradedTask):
    """What the episode tasks share: an episode's return is its reward and its ``solved`` the gold check; training
    starts drawn from ``train_rows``, held-out ones ``eval_rows``."""

    gold_reward = "solved"
    train_rows: list[Any] | None
    eval_rows: list[Any]

    def reward_specs(self) -> list[RewardSpec]:
        return [RewardSpec(episode_return, name="episode_return", required=True),
                RewardSpec(solved, weight=0.0, name="solved")]

    def sample_prompts(self, num_prompts: int, generator: torch.Generator) -> list[Any]:
        picks = torch.randint(len(self.train_rows), (num_prompts,), generator=generator).tolist()
        return [self.train_rows[i] for i in picks]

    def eval_prompts(self) -> list[Any]:
        return list(self.eval_rows)

    def _grade_episodes(self, prompts: Any, responses: Any, completion_ids: Any, trainer_state: Any,
                        cause: str = "its environment's error", batch: str = "a batch") -> tuple[Grades, list[str]]:
        """The episodes' grades (the first failed episode's error as ``episode/error``) and errors; the reward
        functions get each group's prompt (its first episode's) and the start's columns. RunError when every
        episode failed."""
        episodes = [r.episode for group in responses for r in group]
        check_episodes_ended(episodes, cause, batch)
        rows = [prompt_row(start, group[0].episode) for start, group in zip(prompts, responses)]
        grades = super().grade(rows, responses, completion_ids=completion_ids, trainer_state=trainer_state)
        grades.metrics.update(episode_metrics(episodes))
        errors = [e.error for e in episodes if e.error is not None]
        if errors:
            grades.failures["episode/error"] = errors[0]
        return grades, errors


class EnvironmentTask(EpisodeTask):
    """Episodes in an environment, graded by their return; see the module docstring."""

    name = "environment"
    no_gold_hint = "the environment's steps never said whether an episode was solved"
    options = {
        "environment": option("a ready environment (rlvr.environments.games.ENVIRONMENTS)"),
        "environment_factory": option("your environment class, 'module:Class' (an rlvr Environment or a "
                                      "TRL-style environment_factory class); replaces 'environment'"),
        "environment_options": option("keyword arguments of the environment's constructor"),
        "data": option("a JSON Lines file of start rows (each row goes to the environment's reset); "
                       "none: episodes start from seeds"),
        "eval_data": option("a JSON Lines file of held-out start rows (none: the last eval_size rows of data)"),
        "eval_size": option("held-out starts (seeds 0 .. eval_size - 1, or rows)", min=1, max=2**16),
        "max_turns": option("policy turns at most per episode (then truncated)", min=1, max=1000),
        "max_tokens": option("tokens after the prompt at most per episode, the policy's and the environment's "
                             "(then truncated)", min=2, max=2**20),
        "tools": option("sandboxed tools the policy may call, by name (rlvr.environments.tools.TOOLS)"),
        "tool_style": option("how tool calls are written", choices=("plain", "json")),
        "tool_timeout": option("seconds one tool call may take (a sandboxed tool, or the environment's own)",
                               above=0, max=3600),
        "tool_memory_mb": option("memory one tool call may use, MiB", min=16, max=2**20),
        "max_tool_calls": option("tool calls run at most per policy turn; the policy reads that those past it "
                                 "were not run (one failed result, counted in episode/tool_errors)", min=1, max=1000),
        "step_timeout": option("seconds one call into the environment (making it, reset, step, tools()) may "
                               "take; past it the episode ends with an error (counted; its reward abstains)",
                               above=0, max=3600),
        "environment_workers": option("worker processes the episodes' environments live in, episode i in worker "
                                      "i % k: killable, so a call past its time limit is stopped whatever its code "
                                      "does, and calls time out together (0: in the trainer's process, SIGALRM "
                                      "limits only)", min=0, max=1024),
        "environment_memory_mb": option("address space an environment worker may add to what it has when it "
                                        "starts, MiB (past it an allocation fails: MemoryError)", min=64, max=2**20),
    }

    turn_end = ""  # the policy's end of turn as text (``policy_for``)

    def __init__(self, environment: str = "guessing", environment_factory: Any = None,
                 environment_options: dict | None = None, data: str | None = None, eval_data: str | None = None,
                 eval_size: int = 64, max_turns: int = 4, max_tokens: int = 256, tools: list | None = None,
                 tool_style: str = "plain", tool_timeout: float = 5.0, tool_memory_mb: int = 512,
                 step_timeout: float = 30.0, max_tool_calls: int = 8, environment_workers: int = WORKERS,
                 environment_memory_mb: int = 4096) -> None:
        # the options' names are checked against the class here; it is first built by the policy's check_prompts
        self.make_env = environment_factory_of(environment, environment_factory, environment_options or {})
        self.limits = EpisodeLimits(max_turns=max_turns, max_tokens=max_tokens, tool_style=tool_style,
                                    step_timeout=step_timeout, tool_timeout=tool_timeout,
                                    max_tool_calls=max_tool_calls)
        self.hosts = EnvironmentHosts(self.make_env, environment_workers, environment_memory_mb)  # started on first use
        self.tool_names = list(tools or [])
        self.tool_settings = {"timeout": tool_timeout, "memory_mb": tool_memory_mb}
        self._toolbox = None
        self._logged_errors: set[str] = set()  # the kinds of environment error logged so far
        if self.tool_names:
            from rlvr.environments.tools import TOOLS

            unknown = [name for name in self.tool_names if name not in TOOLS]
            if unknown:
                raise ValueError(f"tools: unknown tool {unknown[0]!r}; choose from: {', '.join(TOOLS)}")
        self.train_rows, self.eval_rows = None, list(range(eval_size))
        if data is not None:
            self.train_rows, self.eval_rows = start_rows(data, eval_data, eval_size)
            self.data_files = tuple(p for p in (data, eval_data) if p is not None)

    def policy_for(self, policy: Policy) -> Policy:
        """``policy`` acting in this task's environment. Its end of turn (the LM's EOS text) goes between the turns
        of SFT demonstrations, as an episode holds the EOS id there. ConfigError for ``max_tokens`` that leave no
        room for a prompt in the model's positions."""
        from rlvr.environments.policy import EpisodePolicy

        positions = getattr(policy, "max_positions", None)
        if positions is not None and self.limits.max_tokens >= positions:
            raise ConfigError(f"task.options.max_tokens={self.limits.max_tokens}: an episode's prompt and its "
                              f"{self.limits.max_tokens} tokens after it must fit the model's {positions} positions; "
                              f"lower task.options.max_tokens below {positions}")
        self.turn_end = getattr(getattr(policy, "tokenizer", None), "eos_token", None) or ""
        return EpisodePolicy(policy, self.hosts, self.limits, self.toolbox)

    @property
    def toolbox(self) -> Any:
        """The sandboxed tools' worker pool, started on first use (None: no tools)."""
        if self._toolbox is None and self.tool_names:
            from rlvr.environments.tools import TOOLS, ToolBox

            self._toolbox = ToolBox({name: TOOLS[name] for name in self.tool_names}, **self.tool_settings)
        return self._toolbox

    def sample_prompts(self, num_prompts: int, generator: torch.Generator) -> list[Any]:
        """``num_prompts`` training starts: seeds past the held-out ones, or training rows."""
        if self.train_rows is None:
            return torch.randint(len(self.eval_rows), _TRAIN_SEEDS, (num_prompts,), generator=generator).tolist()
        return super().sample_prompts(num_prompts, generator)

    def fixed_prompts(self) -> dict[str, list[Any]]:
        """The held-out starts, whose prompts the policy checks before any work."""
        return {"eval start": self.eval_prompts()}

    def grade(self, prompts: Any, responses: Any, *, completion_ids: Any = None, trainer_state: Any = None) -> Grades:
        """The episodes' grades (``_grade_episodes``); the first environment error of each kind is logged."""
        grades, errors = self._grade_episodes(prompts, responses, completion_ids, trainer_state)
        self._log_errors(errors)
        return grades

    def completion_columns(self, responses: Any) -> dict[str, list[Any]]:
        """``environments``, as TRL passes them to reward functions: each episode's environment's snapshot as it
        ended (None for an episode whose environment failed)."""
        return {"environments": [r.episode.environment for group in responses for r in group]}

    def _log_errors(self, errors: list[str]) -> None:
        """Log the first error of each kind (what failed and the exception's type) once a run."""
        for error in errors:
            kind = ":".join(error.split(":")[:2])
            if kind not in self._logged_errors:
                self._logged_errors.add(kind)
                logger.warning("an episode ended with its environment's error, its reward abstains (later errors "
                               "alike are counted in episode/env_errors, not logged): %s", error)

    def sft_examples(self, num: int, generator: torch.Generator) -> list[tuple[str, str]]:
        """The ready environment's ``sft_examples``, turns ended by ``turn_end``."""
        import random

        env = self.make_env()
        if not hasattr(env, "sft_examples"):
            raise ValueError(f"{type(env).__name__} has no SFT demonstrations; set sft.data to a JSONL file")
        rng = random.Random(int(torch.randint(2**31, (1,), generator=generator)))
        return env.sft_examples(num, rng, turn_end=self.turn_end)

    def close(self) -> None:
        super().close()
        self.hosts.close()
        if self._toolbox is not None:
            self._toolbox.close()
            self._toolbox = None


def start_rows(data: str, eval_data: str | None, eval_size: int) -> tuple[list[Any], list[Any]]:
    """(training rows, held-out rows): ``eval_data``'s rows, or else the last ``eval_size`` rows of ``data``."""
    rows = read_jsonl(data, {})
    held_out = read_jsonl(eval_data, {}) if eval_data is not None else rows[-eval_size:]
    train = rows if eval_data is not None else rows[:-eval_size]
    if not train:
        raise ValueError(f"data: {data} has {len(rows)} rows, none left for training beside "
                         f"eval_size={eval_size} held out")
    return train, held_out


def prompt_row(start: Any, episode: Episode) -> dict[str, Any]:
    """The reward functions' prompt dict: the episode's first observation and the start's columns."""
    columns = {k: v for k, v in start.items() if k != "prompt"} if isinstance(start, dict) else {"seed": start}
    return {"prompt": episode.prompt, **columns}


def episode_metrics(episodes: Sequence[Episode]) -> dict[str, float]:
    """Per-episode means: policy turns, tool calls and errors, tokens after the prompt, the share truncated..."""
    n = max(len(episodes), 1)
    return {
        "episode/turns": sum(e.policy_turns for e in episodes) / n,
        "episode/tool_calls": sum(e.tool_calls for e in episodes) / n,
        "episode/tool_errors": sum(e.tool_errors for e in episodes) / n,
        "episode/tokens": sum(e.length for e in episodes) / n,
        "episode/policy_tokens": sum(len(t.ids) for e in episodes for t in e.turns if t.trained) / n,
        "episode/truncated": sum(e.truncated for e in episodes) / n,
        "episode/env_errors": sum(e.error is not None for e in episodes) / n,
        # share whose environment said whether it was solved: 0 throughout means no gold check
        "episode/solved_reported": sum(e.solved is not None for e in episodes) / n,
    }


def check_episodes_ended(episodes: Sequence[Episode], cause: str = "its environment's error",
                         batch: str = "a batch") -> None:
    """RunError when every one of a batch's episodes ended with an error (``cause``): every reward abstains, so the
    run would learn nothing (an environment whose step always raises is a broken setup, not bad luck)."""
    if episodes and all(e.error is not None for e in episodes):
        raise RunError(f"every one of the {len(episodes)} episodes of {batch} ended with {cause}, "
                       f"so nothing can be learned; first error: {episodes[0].error}")


def error_warnings(records: Iterable[dict[str, Any]]) -> list[str]:
    """The summary's warning when training episodes ended with their environment's error: their share (the mean
    of the epochs' ``episode/env_errors``, each epoch once) and the first ``episode/error``."""
    shares: dict[int, float] = {}
    first = None
    for record in records:
        if record.get("kind") != "train" or record.get("episode/env_errors") is None or record["epoch"] in shares:
            continue  # the inner steps of an epoch repeat its batch's numbers
        shares[record["epoch"]] = record["episode/env_errors"]
        first = first or record.get("episode/error")
    if not any(shares.values()):
        return []
    share = sum(shares.values()) / len(shares)
    return [f"{share:.1%} of the training episodes ended with their environment's error (episode/env_errors); "
            f"first error: {first or '(not recorded)'}"]


def environment_factory_of(environment: str, factory: Any, options: dict[str, Any]) -> Callable[[], Environment]:
    """What makes one episode's environment: the user's class (adapted) or the ready one named ``environment``."""
    from rlvr.environments.adapters import environment_from_factory, load_environment_factory

    if factory is not None:
        cls = load_environment_factory(factory, "task.options.environment_factory") if isinstance(factory, str) \
            else factory
        _takes(cls, options)
        return environment_from_factory(functools.partial(cls, **options) if options else cls)
    from rlvr.environments.games import ENVIRONMENTS

    if environment not in ENVIRONMENTS:
        raise ValueError(f"environment={environment!r} is not a ready environment; choose from: "
                         f"{', '.join(ENVIRONMENTS)}, or set environment_factory")
    _takes(ENVIRONMENTS[environment], options)
    return functools.partial(ENVIRONMENTS[environment], **options)


def _takes(factory: Callable[..., Any], options: dict[str, Any]) -> None:
    """TypeError when ``factory``'s signature does not take ``options`` (read, not called: no environment code)."""
    import inspect

    try:
        signature = inspect.signature(factory)
    except (TypeError, ValueError):  # no signature to read (a builtin): its first call will tell
        return
    try:
        signature.bind(**options)
    except TypeError as err:
        raise TypeError(f"environment_options: {getattr(factory, '__name__', factory)} does not take them: "
                        f"{err}") from None
