"""A causal LM's part in an episode: its next turn from each episode's token prefix, and the token ids of what the
environment says.

Token in, token out: a prefix is the prompt's ids, then every turn's ids as sampled or appended; the policy's text
is decoded for the environment, never encoded again. An observation is encoded on its own: plain text as it is,
chat messages as the text the chat template adds for them (``rlvr.policies.chat_check.render_delta``).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import torch

from rlvr.engines import Generation
from rlvr.policies.prompts import UnknownCharacters, left_pad, prompt_token_ids

if TYPE_CHECKING:
    from rlvr.policies.causal_lm import CausalLMPolicy


def first_prompt_ids(policy: CausalLMPolicy, prompt: str | list[dict], index: int, max_tokens: int,
                     tools: list[dict] | None = None) -> list[int]:
    """An episode's first observation as the policy encodes prompts; a PromptError names what cannot be encoded or
    leaves the model's positions no room for the episode's ``max_tokens`` tokens."""
    return prompt_token_ids(policy.tokenizer, [prompt], policy.add_special_tokens, max_tokens, policy.max_positions,
                            "episode prompt of start", index, budget="task.options.max_tokens", tools=tools)[0]


def next_turns(policy: CausalLMPolicy, prefixes: list[list[int]], temperature: float, max_new_tokens: int,
               seeds: torch.Tensor | None, stop_strings: tuple[str, ...] = ()) -> tuple[Generation, list[str]]:
    """One turn for each of n episodes from its prefix: the generation [n, T] and each turn's text. ``temperature``
    0 is greedy; else ``seeds`` [n] long make each episode's draws its own. ``stop_strings`` add to the policy's."""
    prompt_ids, prompt_mask = left_pad(prefixes, policy.pad_id)
    stops = tuple(dict.fromkeys((*policy.sampling.stop_strings, *stop_strings)))
    sampling = dataclasses.replace(policy.sampling, temperature=temperature, max_new_tokens=max_new_tokens,
                                   min_new_tokens=min(policy.sampling.min_new_tokens, max_new_tokens),
                                   stop_strings=stops)
    generation = policy.engine.generate(prompt_ids.to(policy.device), prompt_mask.to(policy.device), 1, sampling,
                                        None, None if temperature == 0 else seeds)
    return generation, policy.decode(generation, stops)


def observation_ids(policy: CausalLMPolicy, history: list[dict[str, Any]], observation: str | list[dict],
                    room: int | None = None, tools: list[dict] | None = None) -> tuple[str, list[int] | None]:
    """The text appended for ``observation`` after ``history`` and its token ids, the next generation prompt
    included. Characters the tokenizer has no token for are left out (the text returned is what was encoded).
    An observation longer than ``room`` tokens could hold is neither rendered nor encoded: ("", None)."""
    from rlvr.policies.prompts import content_chars, max_token_chars

    if room is not None and content_chars(observation) > room * max_token_chars(policy.tokenizer):
        return "", None
    if isinstance(observation, str):
        text = observation
    else:
        from rlvr.policies.chat_check import render_delta

        text = render_delta(policy.tokenizer, history, list(observation), **({"tools": tools} if tools else {}))
    try:
        return text, _encoded(policy, text)
    except UnknownCharacters as err:  # e.g. a tool's error message to a character model: what it can read of it
        text = "".join(char for char in text if char not in err.characters)
        return text, _encoded(policy, text)


def end_of_turn_ids(policy: CausalLMPolicy, turn_ids: list[int]) -> list[int]:
    """The ids a chat turn lacks before what follows it: none when it ended with EOS; else (cut at its token limit
    or a stop string) the EOS's ids, which the chat template writes after every assistant turn."""
    tokenizer = policy.tokenizer
    if turn_ids and tokenizer.decode(turn_ids[-1:]) == tokenizer.eos_token:
        return []
    return tokenizer(tokenizer.eos_token, add_special_tokens=False)["input_ids"]


def _encoded(policy: CausalLMPolicy, text: str) -> list[int]:
    return prompt_token_ids(policy.tokenizer, [text], False, 0, None, "environment observation")[0] if text else []
