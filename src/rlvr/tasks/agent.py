"""Agents over HTTP as a task: ``task.name: agent``.

The agent is the user's ``run(client, row)`` (``task.options.agent: "module:function"``), its client pointed at the
episode's own URL on the run's endpoint, where every token sampled is recorded (``rlvr.agents``). An episode's
reward is what its agent returned; the gold check is its ``solved`` (docs/explanation/tasks.md)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rlvr.agents.chat import MAX_CHOICES
from rlvr.agents.runner import AgentLimits, AgentRun
from rlvr.agents.server import MAX_CALLS
from rlvr.base.errors import ConfigError
from rlvr.base.rules import option
from rlvr.batch.interfaces import Policy
from rlvr.batch.rollout import Grades
from rlvr.tasks.environment import EpisodeTask, start_rows


class AgentTask(EpisodeTask):
    """Episodes of the user's agent against the run's endpoint; see the module docstring."""

    name = "agent"
    agent_command: str | list[str] | None = None  # the agent as a program (its run made per endpoint)
    endpoint = None  # the endpoint serving the policy, made by policy_for
    max_calls, max_sampled_tokens = MAX_CALLS, None  # an episode's budgets (None: MAX_CHOICES x max_tokens)
    no_gold_hint = "the agent never said whether an episode was solved (return {'reward': r, 'solved': bool})"
    options = {
        "agent": option("your agent, 'module:function': run(client, row) -> reward or {'reward', 'solved', ...}, "
                        "async with openai.AsyncOpenAI or plain with openai.OpenAI"),
        "agent_command": option("or your agent as a program, run once per episode (jailed where bubblewrap "
                                "runs): the row as JSON on stdin, OPENAI_BASE_URL and OPENAI_API_KEY set, the "
                                "reward (a number or JSON object) as stdout's last line"),
        "agent_memory_mb": option("address space of an agent_command run, MiB", min=64, max=2**20),
        "data": option("a JSON Lines file of rows, each given to the agent"),
        "eval_data": option("a JSON Lines file of held-out rows (none: the last eval_size rows of data)"),
        "eval_size": option("held-out rows", min=1, max=2**16),
        "concurrency": option("episodes run at once", min=1, max=4096),
        "episode_timeout": option("seconds one episode's agent may take; past it the episode abstains", above=0,
                                  max=86400),
        "max_tokens": option("tokens after an episode's first prompt at most, sampled and appended", min=2,
                             max=2**20),
        "max_calls": option("model calls an episode may make (each choice of a request one); past it a request "
                            "gets 400 and the episode counts as truncated", min=1, max=2**16),
        "max_sampled_tokens": option(f"tokens an episode's calls may sample in all (none: {MAX_CHOICES} x "
                                     "max_tokens); past it a request gets 400 and the episode counts as truncated",
                                     min=1, max=2**30),
    }

    def __init__(self, data: str, agent: str | None = None, agent_command: str | list[str] | None = None,
                 agent_memory_mb: int = 2048, eval_data: str | None = None, eval_size: int = 64,
                 concurrency: int = 32, episode_timeout: float = 120.0, max_tokens: int = 1024,
                 max_calls: int = MAX_CALLS, max_sampled_tokens: int | None = None) -> None:
        from rlvr.base.extras import AGENT_MODULES, require
        from rlvr.rewards.calls import RewardError
        from rlvr.rewards.loading import load_reward_function

        require("task.name='agent'", AGENT_MODULES)
        if (agent is None) == (agent_command is None):
            raise ConfigError("task.options: give one of agent ('module:function') and agent_command (a program), "
                              f"not {'both' if agent else 'neither'}")
        self.agent_command, self.agent_memory_mb = agent_command, agent_memory_mb
        self.max_calls, self.max_sampled_tokens = max_calls, max_sampled_tokens
        if agent_command is not None:
            import shlex

            try:
                argv = shlex.split(agent_command) if isinstance(agent_command, str) else list(agent_command)
            except ValueError as err:
                raise ConfigError(f"task.options.agent_command: {err}") from None
            if not argv or not all(isinstance(part, str) and part for part in argv):
                raise ConfigError("task.options.agent_command: expected a command line or a list of its words, "
                                  f"got {agent_command!r:.80}")
        else:
            try:
                agent = load_reward_function(agent)
            except RewardError as err:  # its message speaks of a reward function; say what was loaded here
                raise ConfigError(f"task.options.agent: {str(err).removeprefix('reward function ')}") from err
        self._serve(agent, AgentLimits(concurrency=concurrency, timeout=episode_timeout, max_tokens=max_tokens),
                    *start_rows(data, eval_data, eval_size))
        self.data_files = tuple(p for p in (data, eval_data) if p is not None)

    def _serve(self, agent: Any, limits: AgentLimits, train_rows: list[Any], eval_rows: list[Any]) -> None:
        """Episodes of ``agent`` (None: the ``agent_command`` program) on these rows, within ``limits``."""
        self.agent, self.limits = agent, limits
        self.train_rows, self.eval_rows = train_rows, eval_rows
        self.endpoint = None

    def policy_for(self, policy: Policy) -> Policy:
        """``policy`` served to the agent: its samples are the agent's episodes."""
        from rlvr.agents.policy import AgentPolicy
        from rlvr.agents.server import Endpoint

        positions = getattr(policy, "max_positions", None)
        if positions is not None and self.limits.max_tokens >= positions:
            raise ConfigError(f"task.options.max_tokens={self.limits.max_tokens}: an episode's first prompt and the "
                              f"tokens after it must fit the model's {positions} positions; lower it below {positions}")
        if self.endpoint is None:
            self.endpoint = Endpoint(policy, max_calls=self.max_calls, max_sampled_tokens=self.max_sampled_tokens)
        if self.agent_command is not None:
            from rlvr.agents.command import command_agent

            self.agent = command_agent(self.agent_command, self.endpoint, self.agent_memory_mb)
        return AgentPolicy(policy, self.endpoint, self.agent, self.limits)

    def fixed_prompts(self) -> dict[str, list[Any]]:
        """The held-out rows, for the policy's check before any work (its chat template)."""
        return {"eval row": self.eval_prompts()}

    def grade(self, prompts: Any, responses: Any, *, completion_ids: Any = None, trainer_state: Any = None) -> Grades:
        """The agents' grades, with episode metrics (model calls, segments, the agents' own numbers)."""
        # the evaluation grades the rows eval_prompts gave it, these very objects; a training batch, train_rows'
        held_out = {id(row) for row in self.eval_rows}
        batch = "the held-out evaluation" if prompts and all(id(p) in held_out for p in prompts) else \
            "a training batch"
        grades, _ = self._grade_episodes(prompts, responses, completion_ids, trainer_state, "an error of its agent's",
                                         batch)
        grades.metrics.update(agent_metrics([r.episode for group in responses for r in group]))
        return grades

    def close(self) -> None:
        super().close()
        if self.endpoint is not None:
            self.endpoint.close()


def agent_metrics(runs: Sequence[AgentRun]) -> dict[str, float]:
    """Per-episode means: model calls, segments, the share whose calls split (a rewritten history), and each
    number the agents returned (``agent/<name>``, over the episodes that gave it)."""
    n = max(len(runs), 1)
    metrics = {
        "episode/calls": sum(r.calls for r in runs) / n,
        "episode/segments": sum(r.segments for r in runs) / n,
        "episode/split": sum(r.segments > 1 for r in runs) / n,
    }
    names = sorted({name for r in runs for name in r.metrics})
    for name in names:
        values = [r.metrics[name] for r in runs if name in r.metrics]
        metrics[f"agent/{name}"] = sum(values) / len(values)
    return metrics
