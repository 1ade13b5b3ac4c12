"""A policy turn runs at most task.options.max_tool_calls tool calls: those past it are not
run, and the policy reads one failed result saying so (counted in episode/tool_errors)."""

import pytest
import torch

from rlvr.base.errors import ConfigError
from rlvr.environments.base import Step

pytest.importorskip("transformers")


class Ticks:
    """Its own tool ``tick`` counts the calls that ran; the step after ends the episode."""

    made: list["Ticks"] = []

    def __init__(self):
        self.ran = 0
        Ticks.made.append(self)

    def reset(self, start):
        return "1>"

    def step(self, text):
        return Step(done=True)

    def tools(self):
        return {"tick": self.tick}

    def tick(self, x):
        self.ran += 1
        return str(self.ran)


class StuckTicks(Ticks):
    """A TRL-style tool method no exception stops (SIGALRM blocked, as C code that never returns)."""

    def tick(self, x):
        import signal
        import time

        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
        time.sleep(60)


def episodes_calling(tmp_path, monkeypatch, calls, limits, env=Ticks, workers=0):
    from rlvr.engines import Generation
    from rlvr.environments.episodes import run_episodes
    from rlvr.environments.workers import EnvironmentHosts
    from rlvr.modeling import init_model
    from rlvr.policies import turns
    from rlvr.policies.causal_lm import CausalLMPolicy

    model = init_model(tmp_path / "model", hidden_size=32, intermediate_size=64, num_layers=2, num_heads=2, seed=0,
                       chars="0123456789 >()tick")
    policy = CausalLMPolicy.from_pretrained(str(model), max_new_tokens=8)

    def scripted(policy, prefixes, temperature, max_new_tokens, seeds):  # every turn: `calls` calls of tick
        texts = ["tick(1) " * calls for _ in prefixes]
        ids = [policy.tokenizer(t, add_special_tokens=False)["input_ids"] + [policy.tokenizer.eos_token_id]
               for t in texts]
        response = torch.tensor(ids)
        return Generation(response, torch.ones(response.shape, dtype=torch.bool), torch.zeros(response.shape)), texts

    monkeypatch.setattr(turns, "next_turns", scripted)
    Ticks.made.clear()
    hosts = EnvironmentHosts(env, workers)  # 0: in this process, where a test reads their state
    return run_episodes(policy, hosts, [0, 1], 1, 1.0, torch.Generator().manual_seed(0), limits)


@pytest.mark.parametrize(("cap", "message"), [(None, "12 more tool calls not run: at most 8 tool calls a turn"),
                                              (19, "1 more tool call not run: at most 19 tool calls a turn")])
def test_calls_past_the_cap_are_not_run_and_the_policy_reads_why(tmp_path, monkeypatch, cap, message):
    from rlvr.environments.episodes import EpisodeLimits
    from rlvr.tasks.environment import episode_metrics

    limits = EpisodeLimits(max_turns=1, max_tokens=250) if cap is None else \
        EpisodeLimits(max_turns=1, max_tokens=250, max_tool_calls=cap)
    episodes = episodes_calling(tmp_path, monkeypatch, 20, limits)
    ran = 8 if cap is None else cap
    assert [env.ran for env in Ticks.made] == [ran, ran]  # the default cap is 8
    for episode in episodes:
        policy_turn, tool_turn = episode.turns[:2]
        assert len(policy_turn.tool_calls) == ran
        assert [r.content for r in tool_turn.tool_results] == [str(i) for i in range(1, ran + 1)] + [message]
        assert tool_turn.tool_results[-1].error and episode.tool_errors == 1
    assert episode_metrics(episodes)["episode/tool_errors"] == 1.0


def test_the_cap_is_a_task_option_with_its_rules():
    from rlvr.config import load_config
    from rlvr.tasks.environment import EnvironmentTask

    assert EnvironmentTask(max_tool_calls=3).limits.max_tool_calls == 3
    assert EnvironmentTask().limits.max_tool_calls == 8
    with pytest.raises(ConfigError, match=r"task.options.max_tool_calls=0 must be >= 1"):
        load_config(None, ["task.name=environment", "policy.name=causal_lm", "task.options.max_tool_calls=0"])


def test_an_own_tool_that_hangs_for_good_ends_its_episode_within_the_limit(tmp_path, monkeypatch):
    """The environment's own tool gets tool_timeout whatever its code does: its worker is
    killed, the policy reads the time-out, and the episode, its environment gone, ends."""
    import time

    from rlvr.environments.episodes import EpisodeLimits
    from rlvr.environments.workers import HARD_GRACE

    began = time.monotonic()
    episodes = episodes_calling(tmp_path, monkeypatch, 1, EpisodeLimits(max_turns=2, max_tokens=250,
                                                                        tool_timeout=0.3), env=StuckTicks, workers=4)
    assert time.monotonic() - began < 0.3 + HARD_GRACE + 3  # both episodes' calls together, once
    for episode in episodes:
        [result] = episode.turns[1].tool_results
        assert result.error and result.content == "StepTimeout: no answer within 0.3 s (its worker was killed)"
        assert "its environment is gone" in episode.error and episode.done
