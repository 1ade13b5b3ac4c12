"""A causal LM behind the endpoint: the ``Policy`` whose samples are agents' episodes.

``sample`` runs G agent episodes from each of B rows against the endpoint (``rlvr.agents.runner``) and lays their
joined calls out as ``Samples`` as environment episodes are (``rlvr.environments.episodes.episodes_samples``): the
response is every token after the first prompt, and ``policy_mask`` marks the sampled ones. Scoring, the engine and
its weights are the LM policy's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch

from rlvr.agents.runner import AgentLimits, run_agents
from rlvr.agents.server import Endpoint
from rlvr.base.errors import PromptError
from rlvr.environments.episodes import SEED_RANGE
from rlvr.environments.policy import EpisodePolicy

if TYPE_CHECKING:
    from rlvr.policies.causal_lm import CausalLMPolicy


class AgentPolicy(EpisodePolicy):
    """``lm`` served on ``endpoint`` to the user's ``agent``, within ``limits``."""

    def __init__(self, lm: CausalLMPolicy, endpoint: Endpoint, agent: Callable[..., Any], limits: AgentLimits
                 ) -> None:
        self.lm, self.endpoint, self.agent, self.agent_limits = lm, endpoint, agent, limits
        self.module, self.engine = lm.module, lm.engine

    @property
    def max_response_length(self) -> int:
        """An episode's tokens after its first prompt, sampled and appended: at most ``max_tokens``."""
        return self.agent_limits.max_tokens

    def run(self, prompts: Sequence[Any], group_size: int, temperature: float,
            generator: torch.Generator | None) -> list[Any]:
        """G agent episodes from each of B rows, each with its own seed drawn from ``generator`` (greedy: seed 0)."""
        count = len(prompts) * group_size
        seeds = [0] * count if generator is None else torch.randint(SEED_RANGE, (count,), generator=generator).tolist()
        self.endpoint.start()
        return run_agents(self.endpoint, self.agent, prompts, group_size, temperature, seeds, self.agent_limits)

    def check_prompts(self, prompts: Sequence[Any], what: str = "row") -> None:
        """The chat template alone (the rows are the agent's to read): it must end each assistant turn with the
        policy's end of turn, or an agent's second call could not follow its first (a PromptError, one line)."""
        from rlvr.policies.chat_check import check_turn_end

        try:
            check_turn_end(self.lm.tokenizer)
        except ValueError as err:
            raise PromptError(f"an agent's calls go on after the policy's turn, and {err}") from None
