"""An agent episode's model calls, as the endpoint recorded them, and how they become training sequences.

Every call is recorded token in, token out; nothing is tokenised again. ``join_calls`` joins a call to the segment
its prompt extends most (the ids between become an untrained context turn) or starts a new segment where the agent
rewrote its history; a trie of the segments' ids makes joining linear (docs/explanation/agents.md)."""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from rlvr.environments.base import Turn


@dataclass
class Call:
    """One completion the endpoint served in an episode (``completion_ids``: the end-of-turn token included where
    it stopped; ``text``: what the agent read; ``version``: the weights version that sampled it)."""

    prompt_ids: list[int]
    completion_ids: list[int]
    log_probs: list[float]
    text: str = ""
    finish_reason: str = "stop"
    version: int = 0


@dataclass
class Segment:
    """A training sequence joined from calls: the first call's prompt, then turns (context untrained, completions
    trained), and the indices of the calls it holds."""

    prompt_ids: list[int]
    turns: list[Turn] = field(default_factory=list)
    calls: list[int] = field(default_factory=list)

    @property
    def ids(self) -> list[int]:
        return self.prompt_ids + [i for turn in self.turns for i in turn.ids]


def join_calls(calls: Sequence[Call], decode: Callable[[list[int]], str] | None = None) -> list[Segment]:
    """The episode's calls as training segments, by the module docstring's rule; ``decode``
    gives a context turn's text (none: empty)."""
    segments: list[Segment] = []
    root = _Node()
    for index, call in enumerate(calls):
        node, length, deepest, depth = _walk(root, call.prompt_ids)
        if node is None:
            segments.append(Segment(list(call.prompt_ids)))
            number = len(segments) - 1
        else:
            number = heapq.heappop(node.ends)  # the segment joined: the first made of those ending here
            context = call.prompt_ids[length:]
            if context:
                segments[number].turns.append(Turn("environment", decode(list(context)) if decode else "",
                                                   list(context)))
        segments[number].turns.append(Turn("policy", call.text, list(call.completion_ids), list(call.log_probs)))
        segments[number].calls.append(index)
        end = _grown(_grown(deepest, call.prompt_ids[depth:]), call.completion_ids)
        heapq.heappush(end.ends, number)
    return segments


class _Node:
    """A trie node: the ids that may follow it, and a heap of the segments whose ids end here (first made on top)."""

    __slots__ = ("next", "ends")

    def __init__(self) -> None:
        self.next: dict[int, _Node] = {}
        self.ends: list[int] = []


def _walk(root: _Node, ids: Sequence[int]) -> tuple[_Node | None, int, _Node, int]:
    """``ids`` walked down the trie: the node where the segments that are its longest prefix end, and its depth
    ((None, 0) where none is), then the deepest node reached and its depth."""
    best, best_length = (root, 0) if root.ends else (None, 0)
    node, depth = root, 0
    for token in ids:
        child = node.next.get(token)
        if child is None:
            break
        node, depth = child, depth + 1
        if node.ends:
            best, best_length = node, depth
    return best, best_length, node, depth


def _grown(node: _Node, ids: Sequence[int]) -> _Node:
    """The node ``ids`` lead to from ``node``, the missing ones made."""
    for token in ids:
        child = node.next.get(token)
        if child is None:
            child = node.next[token] = _Node()
        node = child
    return node


@dataclass
class Served:
    """A call with the request's messages (normalised, before the tools' description), tools and reply key."""

    call: Call
    messages: list[dict[str, str]] | None  # None: a /completions call
    tools: Any
    key: Any  # chat.reply_key of the reply; the prompt + completion text for /completions
    stop_cut: bool = False  # ended by a request's stop string, not the end-of-turn token


@dataclass
class AgentEpisode:
    """One episode's record: its calls in order, the first request's prompt, whether a request ran past its token
    budget, and the seed its draws come from."""

    id: str
    seed: int
    temperature: float
    max_tokens: int
    served: list[Served] = field(default_factory=list)
    prompt: Any = None
    first_prompt_length: int | None = None
    truncated: bool = False
    draws: int = 0  # completions asked for so far: the next one's index (its seed, its tool call ids)

    @property
    def calls(self) -> list[Call]:
        return [s.call for s in self.served]
