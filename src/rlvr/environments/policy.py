"""A causal LM acting in an environment: the ``Policy`` whose samples are episodes.

Scoring, the engine and its weights are the LM policy's: an episode is scored as one sequence, the environment's
tokens as context, and only the policy's train (``policy_mask``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from rlvr.base.errors import PromptError
from rlvr.batch.interfaces import Policy
from rlvr.batch.rollout import Samples
from rlvr.environments.base import EpisodeText
from rlvr.environments.episodes import EpisodeLimits, episodes_samples, run_episodes, start_episodes
from rlvr.environments.workers import EnvironmentHosts

CHECKED_STARTS = 8  # starts whose prompts are checked before any work

if TYPE_CHECKING:
    from rlvr.environments.tools import ToolBox
    from rlvr.policies.causal_lm import CausalLMPolicy


class EpisodePolicy(Policy):
    """``lm`` acting in the environments of ``hosts`` within ``limits``, with the sandboxed ``toolbox`` (None: only
    the environment's own tools). Its tokenizer, positions and base model are the LM policy's."""

    def __init__(self, lm: CausalLMPolicy, hosts: EnvironmentHosts, limits: EpisodeLimits,
                 toolbox: ToolBox | None = None) -> None:
        self.lm, self.hosts, self.limits, self.toolbox = lm, hosts, limits, toolbox
        self.module, self.engine = lm.module, lm.engine

    @property
    def tokenizer(self) -> Any:
        return self.lm.tokenizer

    @property
    def max_positions(self) -> int | None:
        return self.lm.max_positions

    @property
    def base_identity(self) -> dict[str, str] | None:
        """The base model a checkpoint of this policy's weights names (``rlvr.runs.checkpoint``)."""
        return self.lm.base_identity

    def encode_prompts(self, prompts: Sequence[Any]) -> tuple[torch.Tensor, torch.Tensor]:
        """The LM's prompt encoding (``rlvr.loop.sft`` trains on whole episodes written as text)."""
        return self.lm.encode_prompts(prompts)

    @property
    def max_response_length(self) -> int:
        """An episode's tokens after the prompt, the policy's and the environment's: at most ``max_tokens``."""
        return self.limits.max_tokens

    def sample(self, prompts: Sequence[Any], group_size: int, temperature: float,
               generator: torch.Generator) -> Samples:
        """G episodes from each of B starts (``prompts``: rows or seeds), drawn with ``generator``."""
        if temperature <= 0:
            raise ValueError(f"temperature must be > 0 for sampling, got {temperature} (use greedy)")
        return episodes_samples(self.run(prompts, group_size, temperature, generator), group_size, self.lm.pad_id)

    def greedy(self, prompts: Sequence[Any]) -> list[list[EpisodeText]]:
        """One greedy episode from each start, as B lists of one ``EpisodeText``."""
        return [[EpisodeText(e)] for e in self.run(prompts, 1, 0.0, None)]

    def run(self, prompts: Sequence[Any], group_size: int, temperature: float,
            generator: torch.Generator | None) -> list[Any]:
        """The episodes ``sample`` and ``greedy`` lay out (greedy: temperature 0, no generator)."""
        return run_episodes(self.lm, self.hosts, prompts, group_size, temperature, generator, self.limits,
                            self.toolbox)

    def log_probs(self, samples: Samples, temperature: float, with_entropy: bool = False,
                  module: torch.nn.Module | None = None, entropy_grad: bool = False,
                  ) -> tuple[torch.Tensor, torch.Tensor | None]:
        return self.lm.log_probs(samples, temperature, with_entropy, module, entropy_grad)

    def sync_engine(self, version: int | None = None) -> dict[str, float]:
        return self.lm.sync_engine(version)

    def check_prompts(self, prompts: Sequence[Any], what: str = "start") -> None:
        """Before any work: the first prompts of these starts encode and leave room for ``max_tokens`` (a
        PromptError names the start), and with a chat template, conversations of those prompts render the same
        turn by turn, as episodes are built, as whole."""
        chats = []
        starts = list(prompts)[:CHECKED_STARTS]
        for index, running in enumerate(start_episodes(self.lm, self.hosts, starts, range(len(starts)), self.limits)):
            if running.episode.error is not None:
                raise PromptError(f"{what} {index}: {running.episode.error}", index)
            prompt = running.episode.prompt
            if not isinstance(prompt, str):
                chats.append([*prompt, {"role": "assistant", "content": "1"}, {"role": "user", "content": "2"},
                              {"role": "assistant", "content": "3"}])
        if chats:
            from rlvr.policies.chat_check import check_chat_template

            try:
                differences = check_chat_template(self.lm.tokenizer, chats, limit=1)
            except ValueError as err:  # a template that ends no assistant turn
                raise PromptError(str(err)) from None
            if differences:
                raise PromptError(f"the chat template renders an episode differently turn by turn (as episodes are "
                                  f"built, token in, token out) than whole: {differences[0]}; use a template that "
                                  "renders earlier turns unchanged (policy.options.chat_template)")

    def truncated(self, samples: Samples) -> torch.Tensor:
        """[N] bool: the episodes ended by the turn or token limit (recorded when they ran)."""
        if samples.truncated is None:
            raise ValueError("these samples were not made by episodes: no record of which were truncated")
        return samples.truncated
