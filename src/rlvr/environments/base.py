"""Episodes in the project's own words: an environment, its steps, tool calls and the turns of an episode.

An episode starts from a dataset row (a dict) or a seed (an int): ``Environment.reset`` returns the first
observation, the prompt. Then, turn by turn, the policy writes text; a turn that calls tools gets the tools' results
back, any other turn goes to ``Environment.step``, which answers with the next observation, a reward and whether
the episode is done. An episode also ends at a turn limit or a total-token limit (truncated). Its return is the sum
of its step rewards; its ``solved`` is the gold check, the last value a step gave.

The policy's turns are the token ids it sampled; an observation is appended as token ids of its own
(``rlvr.environments.episodes``); decoded text is never tokenized again.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from rlvr.policies.chat_check import Message

Observation = str | list[Message]  # text appended as it is, or chat messages rendered by the chat template


@dataclass(frozen=True)
class ToolCall:
    """A tool call parsed from a policy turn: the tool's name and its keyword arguments."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ToolResult:
    """What a tool call gave: its output as text (what the policy reads), and whether it failed (raised, timed
    out, ran out of memory, printed too much, no such tool, bad arguments); then ``content`` is the error."""

    name: str
    content: str
    error: bool = False


def describe_error(exc: BaseException, limit: int | None = None) -> str:
    """"<ExcType>: <message>" of environment or tool code's exception (whose ``__str__`` may fail), cut to
    ``limit`` characters with "..." (None: whole)."""
    try:
        text = f"{type(exc).__name__}: {exc}".removesuffix(": ")
    except BaseException:  # noqa: BLE001 - the exception's own __str__ failed
        text = type(exc).__name__
    return text if limit is None or len(text) <= limit else text[:limit] + "..."


class ToolError(Exception):
    """Raised by a tool to fail with a message the policy reads whole (up to ``max_output_chars``), not cut to a
    line as another exception's is."""


@dataclass(frozen=True)
class Step:
    """The environment's answer to one policy turn."""

    observation: Observation | None = None  # what the policy sees next (None: nothing more; meant with ``done``)
    reward: float = 0.0  # an episode's return is the sum over its steps
    done: bool = False
    solved: bool | None = None  # the gold check, when this step knows it (None: unchanged)


class Environment(Protocol):
    """One episode's world (a new instance per episode: it may keep state).

    ``reset(start)`` begins the episode from ``start`` (a dataset row or an int seed) and returns the first
    observation. ``step(text)`` takes the policy's text of one turn that called no tool. ``tools()`` names the
    callables bound to this episode (TRL's environment methods), called where the environment lives.

    Optional, read where defined: ``tool_schemas()``, the function schemas the policy is shown (none: the prompt
    describes its tools); ``final_reward()``, the (reward, solved) of an episode ended at its turn or token limit;
    ``snapshot()``, this episode's entry of reward functions' ``environments`` (default: its public attributes).
    """

    def reset(self, start: Any) -> Observation:
        ...

    def step(self, text: str) -> Step:
        ...

    def tools(self) -> dict[str, Callable[..., Any]]:
        return {}


EnvironmentFactory = Callable[[], Environment]


@dataclass
class Turn:
    """One stretch of an episode's tokens after the prompt."""

    role: str  # "policy" (sampled, trained), or "environment" / "tool" (appended, never trained)
    text: str  # the policy's decoded text, or the observation as rendered
    ids: list[int]  # exactly those sampled (policy) or appended (the others)
    log_probs: list[float] = field(default_factory=list)  # the sampler's, of each policy token
    tool_calls: list[ToolCall] = field(default_factory=list)  # parsed from a policy turn
    tool_results: list[ToolResult] = field(default_factory=list)  # what they gave (tool turns)
    reward: float = 0.0  # the step reward this turn earned (the environment's turn after a policy turn)
    note: str = ""  # what happened to it, for a person (an observation too long to encode)

    @property
    def trained(self) -> bool:
        return self.role == "policy"


@dataclass
class Episode:
    """A whole episode: its start, the prompt's token ids, the turns after it, and how it ended."""

    start: Any
    prompt: Observation
    prompt_ids: list[int]
    turns: list[Turn] = field(default_factory=list)
    solved: bool | None = None  # None: its environment never said (no gold check)
    done: bool = False
    truncated: bool = False  # ended by the turn limit or the token limit, not by the environment
    error: str | None = None  # its environment failed (raised, hung, wrong type), one line; its reward abstains
    environment: Any = None  # its environment's snapshot when it ended (reward functions' ``environments``)
    # further sequences that train with its delta, each (prompt ids, turns): an agent's calls
    # after it rewrote its history (``rlvr.agents.calls``); the prompt and turns above are the first
    more_segments: list[tuple[list[int], list[Turn]]] = field(default_factory=list)

    @property
    def episode_return(self) -> float:
        return sum(turn.reward for turn in self.turns)

    @property
    def policy_turns(self) -> int:
        return sum(turn.role == "policy" for turn in self.turns)

    @property
    def tool_calls(self) -> int:
        return sum(len(turn.tool_calls) for turn in self.turns)

    @property
    def tool_errors(self) -> int:
        return sum(result.error for turn in self.turns for result in turn.tool_results)

    @property
    def response_ids(self) -> list[int]:
        """Every token after the prompt, the policy's and the rest, in order."""
        return [i for turn in self.turns for i in turn.ids]

    @property
    def length(self) -> int:
        return sum(len(turn.ids) for turn in self.turns)


class EpisodeText(str):
    """An episode as reward functions see it: the text of every turn after the prompt, with the episode itself
    as ``episode`` (its return, ``solved``, turns)."""

    episode: Episode

    def __new__(cls, episode: Episode) -> EpisodeText:
        later = [turn for _, turns in episode.more_segments for turn in turns]  # a rewritten history's segments
        text = super().__new__(cls, "".join(turn.text for turn in [*episode.turns, *later]))
        text.episode = episode
        return text

    def __reduce__(self) -> tuple:
        return EpisodeText, (self.episode,)

    def as_record(self) -> list[dict[str, Any]]:
        """The turns as a samples table shows them, each later segment's after a line that says it starts; then
        the environment's error, where one ended the episode."""
        rows = []
        numbered = [(0, turn) for turn in self.episode.turns]
        numbered += [(k, turn) for k, (_, turns) in enumerate(self.episode.more_segments, 1) for turn in turns]
        segment = 0
        for k, turn in numbered:
            if k != segment:
                segment = k
                rows.append({"role": "segment", "text": f"segment {k + 1}: a new sequence (the history was rewritten)",
                             "trained": False})
            row: dict[str, Any] = {"role": turn.role, "text": turn.text, "trained": turn.trained}
            if turn.tool_calls:
                row["tool_calls"] = [{"name": c.name, "arguments": c.arguments} for c in turn.tool_calls]
            if turn.tool_results:
                row["tool_results"] = [{"name": r.name, "content": r.content, "error": r.error}
                                       for r in turn.tool_results]
            if turn.reward:
                row["reward"] = turn.reward
            if turn.note:
                row["note"] = turn.note
            rows.append(row)
        if self.episode.error is not None:
            rows.append({"role": "environment", "text": "", "trained": False, "error": self.episode.error})
        return rows
