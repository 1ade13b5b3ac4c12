"""Episodes token in, token out: batching equals one episode at a time, the trained ids are
the sampled ids, the environment's tokens get no gradient, limits truncate, and a failing
environment ends its episode, counted, without stopping the batch."""

import threading
import time

import pytest
import torch

from helpers import CHAT_TEMPLATE
from rlvr.config import config_from_dict
from rlvr.environments.base import Step
from rlvr.environments.episodes import EpisodeLimits, episodes_samples, run_episodes
from rlvr.environments.workers import EnvironmentHosts

pytest.importorskip("transformers")

CHARS = "0123456789 >+-*=()"


@pytest.fixture(scope="module")
def policy(tiny_model):
    from rlvr.policies.causal_lm import CausalLMPolicy

    return CausalLMPolicy.from_pretrained(str(tiny_model), max_new_tokens=5)


class Countdown:
    """Three steps of " +>" after the prompt "= <start>>", a reward of 0.5 each; solved at the third."""

    def reset(self, start):
        self.turns = 0
        return f"={start}>"

    def step(self, text):
        self.turns += 1
        done = self.turns >= 3
        return Step(None if done else " +>", 0.5, done=done, solved=done)


class Endless(Countdown):
    """Never done: the runner's limits end it, after an observation."""

    def step(self, text):
        return Step(" ->", 0.0)


LIMITS = EpisodeLimits(4, 40)


def sample(policy, env=Countdown, starts=(1, 2, 3), group=2, limits=LIMITS, seed=0, workers=8, **kwargs):
    episodes = run_episodes(policy, EnvironmentHosts(env, workers), list(starts), group, 1.0,
                            torch.Generator().manual_seed(seed), limits, **kwargs)
    return episodes, episodes_samples(episodes, group, policy.pad_id)


def test_a_batch_of_episodes_equals_the_episodes_run_one_at_a_time(policy):
    seeds = torch.randint(2**62, (6,), generator=torch.Generator().manual_seed(3))
    limits = EpisodeLimits(4, 40)
    batch = run_episodes(policy, EnvironmentHosts(Countdown), [1, 2, 3], 2, 1.0, None, limits, seeds=seeds)
    alone = [run_episodes(policy, EnvironmentHosts(Countdown), [start], 1, 1.0, None, limits,
                          seeds=seeds[i:i + 1])[0]
             for i, start in enumerate([1, 1, 2, 2, 3, 3])]
    assert [e.response_ids for e in batch] == [e.response_ids for e in alone]
    assert len({tuple(e.response_ids) for e in batch}) > 1  # the seeds differ, and so do the episodes
    greedy = run_episodes(policy, EnvironmentHosts(Countdown), [1, 2, 3], 1, 0.0, None, limits)
    greedy_alone = [run_episodes(policy, EnvironmentHosts(Countdown), [s], 1, 0.0, None, limits)[0]
                    for s in (1, 2, 3)]
    assert [e.response_ids for e in greedy] == [e.response_ids for e in greedy_alone]


def test_the_trained_ids_are_the_sampled_ids_and_only_the_policys_tokens_train(policy):
    episodes, samples = sample(policy)
    tokenizer = policy.tokenizer
    for row, episode in enumerate(episodes):
        length = episode.length
        assert samples.response_ids[row, :length].tolist() == episode.response_ids
        at = 0
        for turn in episode.turns:
            span = slice(at, at + len(turn.ids))
            assert samples.policy_mask[row, span].all().item() == turn.trained or not turn.ids
            assert samples.policy_mask[row, span].any().item() == (turn.trained and bool(turn.ids))
            if not turn.trained and turn.ids:  # the observation's own ids, appended: never the decoded text re-encoded
                assert turn.ids == tokenizer(turn.text, add_special_tokens=False)["input_ids"]
            at += len(turn.ids)
        assert not samples.response_mask[row, length:].any() and samples.response_mask[row, :length].all()
    assert (samples.response_mask & ~samples.policy_mask).any()  # the environment's tokens are in the sequence
    # the sampler's log-probs are the policy's own scores of the same ids
    scored, _ = policy.log_probs(samples, 1.0)
    gap = ((scored - samples.sample_log_probs).abs() * samples.policy_mask).max().item()
    assert gap < 1e-5
    assert torch.equal(samples.sample_log_probs * ~samples.policy_mask, torch.zeros_like(scored))


def _gradient(policy, samples, deltas, config):
    from rlvr.batch.rollout import Rollout
    from rlvr.core import aggregation_weights
    from rlvr.loop.step import accumulate_gradients

    with torch.no_grad():
        old, _ = policy.log_probs(samples, 1.0)
    ref = old + 0.1 * torch.randn(old.shape, generator=torch.Generator().manual_seed(0))
    weights = aggregation_weights(samples.policy_mask, config.algo.aggregation, 50)
    rollout = Rollout(samples, deltas, old, ref, weights, {})
    policy.module.zero_grad()
    sums = accumulate_gradients(config, policy, rollout, 2)
    grads = torch.cat([p.grad.flatten() for p in policy.module.parameters()])
    return grads, {k: float(v) for k, v in sums.items()}


def test_the_environments_tokens_get_no_gradient_and_count_in_no_metric(policy):
    config = config_from_dict({"algo": {"loss": "clipped", "kl_coef": 0.1, "entropy_coef": 0.01, "group_size": 2,
                                        "aggregation": "token_mean"}, "log": {"entropy": True}})
    episodes, samples = sample(policy, env=Endless, limits=EpisodeLimits(2, 40))
    env_tokens = samples.response_mask & ~samples.policy_mask
    # every episode ends with the environment's last observation: tokens after every policy token
    last_policy = torch.where(samples.policy_mask, torch.arange(samples.response_ids.shape[1]), -1).max(dim=1).values
    trailing = env_tokens & (torch.arange(samples.response_ids.shape[1]) > last_policy[:, None])
    assert trailing.any(dim=1).all()
    deltas = torch.linspace(-1, 1, samples.num_responses)
    grads, sums = _gradient(policy, samples, deltas, config)
    # other ids for the trailing environment tokens, garbage sampler log-probs on every environment token
    samples.response_ids = torch.where(trailing, (samples.response_ids + 3) % len(CHARS), samples.response_ids)
    samples.sample_log_probs = torch.where(env_tokens, torch.full_like(samples.sample_log_probs, -7.0),
                                           samples.sample_log_probs)
    perturbed, perturbed_sums = _gradient(policy, samples, deltas, config)
    assert grads.abs().sum() > 0
    assert torch.allclose(grads, perturbed, atol=1e-7, rtol=1e-5)
    assert sums == pytest.approx(perturbed_sums, rel=1e-5, abs=1e-7)


def test_the_turn_limit_and_the_token_limit_truncate(policy):
    episodes, samples = sample(policy, env=Endless, limits=EpisodeLimits(max_turns=2, max_tokens=200))
    assert all(e.truncated and e.policy_turns == 2 for e in episodes)
    assert samples.truncated.all()
    episodes, samples = sample(policy, env=Endless, limits=EpisodeLimits(max_turns=50, max_tokens=12))
    assert all(e.truncated and e.length <= 12 for e in episodes)
    assert samples.response_mask.sum(dim=1).max() <= 12
    episodes, _ = sample(policy, limits=EpisodeLimits(max_turns=5, max_tokens=200))
    assert all(e.done and not e.truncated and e.solved and e.episode_return == 1.5 for e in episodes)


class Floods(Countdown):
    """Answers with 20 million characters: far past any token budget."""

    def step(self, text):
        return Step("+" * 20_000_000, 0.0)


class LongPrompt(Countdown):
    def reset(self, start):
        return "1" * 20_000_000


def _counting_encodes(policy, monkeypatch):
    """The longest text the policy's tokenizer is handed, as it runs."""
    seen = [0]
    tokenizer = type(policy.tokenizer)
    encode = tokenizer.__call__

    def counted(self, text, *args, **kwargs):
        seen[0] = max([seen[0], *(len(t) for t in ([text] if isinstance(text, str) else text))])
        return encode(self, text, *args, **kwargs)

    monkeypatch.setattr(tokenizer, "__call__", counted)
    return seen


def test_text_past_the_budget_is_not_encoded_and_the_record_says_so(policy, monkeypatch):
    from rlvr.base.errors import PromptError
    from rlvr.environments.base import EpisodeText

    seen = _counting_encodes(policy, monkeypatch)
    episodes, _ = sample(policy, env=Floods, starts=(1,), group=1, limits=EpisodeLimits(max_turns=3, max_tokens=40))
    (episode,) = episodes
    assert episode.truncated and episode.turns[-1].ids == [] and seen[0] < 1000
    note = EpisodeText(episode).as_record()[-1]["note"]
    assert note.startswith("an observation of 20000000 characters, more than the ") and "not encoded" in note
    with pytest.raises(PromptError, match=r"episode prompt of start 0 .*20000000 characters, more than \d+"):
        sample(policy, env=LongPrompt, starts=(1,), group=1)
    assert seen[0] < 1000


def test_a_prompt_cut_where_it_was_made_is_never_encoded_where_the_model_states_no_positions(policy, monkeypatch):
    from rlvr.base.errors import PromptError

    monkeypatch.setattr(policy, "max_positions", None)
    seen = _counting_encodes(policy, monkeypatch)
    with pytest.raises(PromptError, match=r"^episode prompt of start 0 \('1111.*: 20000000 characters, more than "
                                          r"its episode could hold .*; shorten the prompt or raise "
                                          r"task.options.max_tokens$"):
        sample(policy, env=LongPrompt, starts=(1,), group=1, limits=EpisodeLimits(max_turns=2, max_tokens=8))
    assert seen[0] == 0  # nothing encoded: not the prompt, nor the characters of it that crossed


class Ones(Countdown):
    """A prompt of ``start`` ones, a token each."""

    def reset(self, start):
        self.turns = 0
        return "1" * start


def test_the_start_check_reads_each_prompt_whole_as_its_episodes_do(policy):
    """A prompt longer than max_tokens tokens of the longest token (8 x 5 characters) but within
    the model's 256 positions passes the start check and runs whole; one too long in tokens
    (300, in fewer characters than the positions' 1,280) is refused by the check, not mid-run."""
    from rlvr.base.errors import PromptError
    from rlvr.environments.policy import EpisodePolicy

    limits = EpisodeLimits(max_turns=2, max_tokens=8)
    hosts = EnvironmentHosts(Ones, 1)
    try:
        episodic = EpisodePolicy(policy, hosts, limits)
        episodic.check_prompts([100])
        with pytest.raises(PromptError, match=r"^episode prompt of start 0 \('1111.*: 30\d tokens "
                                              r"\+ max_tokens 8 = 3\d\d > 256, the model's positions"):
            episodic.check_prompts([300])
        (episode,) = run_episodes(policy, hosts, [100], 1, 0.0, None, limits)
        assert episode.prompt_ids == policy.tokenizer("1" * 100, add_special_tokens=policy.add_special_tokens)[
            "input_ids"]
    finally:
        hosts.close()


class Raises(Countdown):
    def step(self, text):
        raise RuntimeError("the environment broke")


class Hangs(Countdown):
    def step(self, text):
        while True:
            time.sleep(0.01)


class WrongType(Countdown):
    def step(self, text):
        return {"observation": "x"}


class Allocates(Countdown):
    def step(self, text):
        raise MemoryError()


class NoneReward(Countdown):
    def step(self, text):
        return Step(" +>", None)


class TextReward(Countdown):
    def step(self, text):
        return Step(" +>", "1")


class _Unanswerable:
    def __bool__(self):
        raise ValueError("no truth value")


class SolvedRaises(Countdown):
    def step(self, text):
        return Step(" +>", 0.5, solved=_Unanswerable())


class ResetRaises(Countdown):
    def reset(self, start):
        raise RuntimeError("no reset today")


class ResetHangs(Countdown):
    def reset(self, start):
        time.sleep(60)


class ResetNumber(Countdown):
    def reset(self, start):
        return 42


class ResetNothing(Countdown):
    def reset(self, start):
        return None


class Exits(Countdown):
    def step(self, text):
        raise SystemExit(0)


class Interrupts(Countdown):
    def step(self, text):
        raise KeyboardInterrupt


class Recurses(Countdown):
    def step(self, text):
        return self.step(text)


class SwallowsTimeouts(Countdown):
    def step(self, text):
        while True:
            try:
                time.sleep(0.01)
            except Exception:  # noqa: BLE001, S112 - what a careless environment does
                continue


class ToolsRaise(Countdown):
    def tools(self):
        raise RuntimeError("no tools")


class ToolsNotMapping(Countdown):
    def tools(self):
        return ["calculator"]


class MakingFails(Countdown):
    def __init__(self):
        raise ValueError("cannot make it")


@pytest.mark.parametrize("broken, message", [(Raises, "the environment broke"), (Hangs, "no answer within"),
                                             (WrongType, "not an rlvr Step"), (Allocates, "MemoryError"),
                                             (NoneReward, "a reward is a real number, not NoneType"),
                                             (TextReward, "a reward is a real number, not str"),
                                             (SolvedRaises, "no truth value"),
                                             (ResetRaises, "ResetRaises.reset: RuntimeError: no reset today"),
                                             (ResetHangs, "ResetHangs.reset: StepTimeout: no answer within 0.2 s"),
                                             (ResetNumber, "reset returned int 42, not text or a list of messages"),
                                             (ResetNothing, "reset returned None, not text"),
                                             (Exits, "Exits.step: SystemExit: 0"),
                                             (Interrupts, "Interrupts.step: KeyboardInterrupt"),
                                             (Recurses, "RecursionError"),
                                             (SwallowsTimeouts, "no answer within 0.2 s"),
                                             (ToolsRaise, "ToolsRaise.tools: RuntimeError: no tools"),
                                             (ToolsNotMapping, "tools() returned list"),
                                             (MakingFails, "making the environment: ValueError: cannot make it")])
def test_a_failing_environment_ends_its_episode_counted_and_the_others_go_on(policy, broken, message):
    made = iter([broken if i % 2 else Countdown for i in range(6)])  # made in this process, in order
    limits = EpisodeLimits(4, 40, step_timeout=0.2)
    episodes, samples = sample(policy, env=lambda: next(made)(), limits=limits, workers=0)
    failed = [e for i, e in enumerate(episodes) if i % 2]
    assert all(e.error and message in e.error and e.done and not e.solved for e in failed)
    assert all(e.error is None and e.solved for i, e in enumerate(episodes) if not i % 2)
    from rlvr.tasks.environment import episode_metrics, episode_return

    assert episode_metrics(episodes)["episode/env_errors"] == 0.5
    assert episode_return(samples.responses[0]) == [1.5, None]  # a broken episode's reward abstains


def test_a_chat_episode_takes_text_or_messages_only():
    from rlvr.environments.base import Episode
    from rlvr.environments.episodes import _Running

    chat = _Running(Episode(start=0, prompt=[{"role": "user", "content": "hi"}], prompt_ids=[1]), 0, "Countdown")
    assert chat.observation("more") == [{"role": "user", "content": "more"}]
    for wrong in (42, [1, 2], {"role": "user"}):
        with pytest.raises(TypeError, match="a chat episode takes text or a list of messages"):
            chat.observation(wrong)


def test_a_hanging_environment_is_said_on_the_console_at_its_first_timeout(policy, caplog):
    import logging

    from rlvr.environments import workers as hosts

    hosts._TIMED_OUT.discard("SlowStep.step")

    class SlowStep(Hangs):
        pass

    with caplog.at_level(logging.WARNING, logger="rlvr.environments.workers"):
        found, _ = sample(policy, env=SlowStep, starts=(1, 2), group=2, limits=EpisodeLimits(4, 40, step_timeout=0.1))
    assert all("no answer within 0.1 s" in e.error for e in found)
    said = [r.getMessage() for r in caplog.records if "ran past its time limit" in r.getMessage()]
    assert said == ["SlowStep.step ran past its time limit of 0.1 s: its episode ends with an error; calls that hang "
                    "like it time out together, each batch (task.options.step_timeout or tool_timeout)"]


def test_hanging_episodes_time_out_together_not_one_after_another(policy):
    began = time.perf_counter()
    found, _ = sample(policy, env=Hangs, starts=(1, 2, 3), group=2, limits=EpisodeLimits(4, 40, step_timeout=1.0))
    took = time.perf_counter() - began
    assert all("Hangs.step: StepTimeout: no answer within 1 s" == e.error for e in found)
    # six hanging steps in about one limit, not 6 x 1 s one after another (room for a loaded machine)
    assert took < 4.0


class ChatAgain:
    """A chat: the question, then "again" after each turn, three turns."""

    def reset(self, start):
        self.turns = 0
        return [{"role": "user", "content": f"Count from {start}."}]

    def step(self, text):
        self.turns += 1
        done = self.turns >= 3
        return Step(None if done else [{"role": "user", "content": "again"}], 0.0, done=done)


def test_a_chat_turn_cut_at_max_new_tokens_gets_its_end_of_turn_before_the_reply(chat_model):
    """Token in, token out with a chat template: the episode's ids are the whole conversation
    rendered, each policy turn as sampled, the EOS the template writes after an assistant turn
    added (untrained) where the turn was cut at its token limit."""
    from rlvr.policies.causal_lm import CausalLMPolicy

    chat_policy = CausalLMPolicy.from_pretrained(str(chat_model), max_new_tokens=3)
    tok = chat_policy.tokenizer
    hosts = EnvironmentHosts(ChatAgain, workers=0)
    try:
        episodes = run_episodes(chat_policy, hosts, [1, 2, 3, 4], 2, 1.0, torch.Generator().manual_seed(0),
                                EpisodeLimits(4, 200))
    finally:
        hosts.close()
    cut = 0
    for e in episodes:
        assert e.policy_turns == 3
        messages, before_last, previous = list(e.prompt), [], []
        for k, turn in enumerate(e.turns):
            if turn.trained:
                before_last = e.prompt_ids + [i for t in e.turns[:k] for i in t.ids]
                messages.append({"role": "assistant", "content": tok.decode(turn.ids).removesuffix("<eos>")})
            elif turn.ids:  # the reply: the EOS first where the turn before it was cut
                was_cut = not tok.decode(previous).endswith("<eos>")
                cut += was_cut
                assert tok.decode(turn.ids).startswith("<eos>") == was_cut
                messages.append({"role": "user", "content": "again"})
            previous = turn.ids
        whole = tok.apply_chat_template(messages[:-1], tokenize=False, add_generation_prompt=True)
        assert tok.decode(before_last) == whole
    assert cut > 0  # turns were cut at 3 tokens, and got their EOS


class ScoredByState:
    """A TRL-style class: its reward is its state, read by get_reward()."""

    def reset(self, **row):
        return None

    def get_reward(self):
        return 0.75


def test_a_trl_style_episode_ended_by_the_token_budget_reads_get_reward(policy):
    from rlvr.environments.adapters import environment_from_factory

    hosts = EnvironmentHosts(environment_from_factory(ScoredByState), workers=0)
    try:
        episodes = run_episodes(policy, hosts, [{"prompt": "=1>"}, {"prompt": "=2>"}], 4, 1.0,
                                torch.Generator().manual_seed(0), EpisodeLimits(4, 3))
    finally:
        hosts.close()
    assert any(e.truncated for e in episodes)  # cut at 3 tokens, before any step
    assert [e.episode_return for e in episodes] == [0.75] * 8


TOOLS_TEMPLATE = (  # a template with a tools slot that teaches <tool_call>, as Qwen's and Hermes' do
    "{% if tools %}<|tools|>\n{% for t in tools %}{{ t.function.name }}: {{ t.function.description }}\n{% endfor %}"
    "Call one as <tool_call>{...}</tool_call>.{{ eos_token }}\n{% endif %}" + CHAT_TEMPLATE
)
SCHEMA = {"type": "function", "function": {"name": "add", "description": "Add two numbers.",
                                           "parameters": {"type": "object", "properties": {}, "required": []}}}


class ShowsTools:
    """A chat environment that shows the policy one tool and answers every turn, three turns."""

    def reset(self, start):
        self.turns = 0
        return [{"role": "user", "content": f"go {start}"}]

    def tool_schemas(self):
        return [SCHEMA]

    def step(self, text):
        self.turns += 1
        return Step([{"role": "user", "content": "again"}], 0.0, done=self.turns >= 3)


@pytest.mark.parametrize("slot", [False, True])
def test_an_environments_tools_reach_the_policy_through_the_template_slot_or_the_system_message(chat_model, slot):
    """Where the template has a tools slot and calls are written in the json style, the
    schemas go there, in the first prompt and in every observation's render alike (the
    episode's ids are the whole conversation rendered with them); else the system message
    describes them and the template gets none."""
    from rlvr.environments.tool_parsing import describe_tools
    from rlvr.policies.causal_lm import CausalLMPolicy

    chat_policy = CausalLMPolicy.from_pretrained(str(chat_model), max_new_tokens=3)
    tok = chat_policy.tokenizer
    if slot:
        tok.chat_template = TOOLS_TEMPLATE
    hosts = EnvironmentHosts(ShowsTools, workers=0)
    try:
        episodes = run_episodes(chat_policy, hosts, [1, 2], 1, 1.0, torch.Generator().manual_seed(0),
                                EpisodeLimits(3, 300, tool_style="json"))
    finally:
        hosts.close()
    for e in episodes:
        assert e.prompt == [{"role": "user", "content": f"go {e.start}"}]  # reward functions see the prompt as given
        first = tok.decode(e.prompt_ids)
        if slot:
            assert first.startswith("<|tools|>\nadd: Add two numbers.\nCall one as <tool_call>{...}</tool_call>.<eos>"
                                    "\n<|user|>\ngo")
        else:
            assert first.startswith("<|system|>\nYou can call these tools.") and '"name": "add"' in first
            assert "<tool_call>" in first and "<|tools|>" not in first
        messages = list(e.prompt) if slot else describe_tools(list(e.prompt), [SCHEMA], "json")
        for k, turn in enumerate(e.turns):
            if turn.trained:  # the ids before each policy turn: the conversation so far, rendered whole
                before = e.prompt_ids + [i for t in e.turns[:k] for i in t.ids]
                whole = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True,
                                                tools=[SCHEMA] if slot else None)
                assert tok.decode(before) == whole
                messages.append({"role": "assistant", "content": tok.decode(turn.ids).removesuffix("<eos>")})
            elif turn.ids:
                messages.append({"role": "user", "content": "again"})
        assert e.policy_turns == 3


class Noted:
    """A TRL-style class with state a reward function reads from ``environments``."""

    def reset(self, **row):
        self.reward, self.seen, self.lock = 0.25, row.get("n"), threading.Lock()  # a lock does not pickle
        return None


def test_each_episode_keeps_a_copy_of_its_environments_public_attributes(policy):
    from rlvr.environments.adapters import environment_from_factory

    hosts = EnvironmentHosts(environment_from_factory(Noted), workers=0)
    try:
        episodes = run_episodes(policy, hosts, [{"prompt": "=1>", "n": 1}, {"prompt": "=2>", "n": 2}], 2, 1.0,
                                torch.Generator().manual_seed(0), EpisodeLimits(1, 4))
    finally:
        hosts.close()
    assert [vars(e.environment) for e in episodes] == [{"reward": 0.25, "seen": n} for n in (1, 1, 2, 2)]


def test_a_tools_slot_that_teaches_another_call_syntax_is_not_used():
    """Llama 3's and Mistral's templates take tools but teach calls other than <tool_call>,
    which is what is parsed: there the system message describes the tools."""
    from rlvr.environments.tool_parsing import shown_tools

    chat = [{"role": "user", "content": "hi"}]
    llama_like = "{% if tools %}Call a function as {\"name\": ..., \"parameters\": ...}{% endif %}" + CHAT_TEMPLATE
    shown, tools = shown_tools(llama_like, chat, [SCHEMA], "json")
    assert tools is None and shown[0]["role"] == "system" and "<tool_call>" in shown[0]["content"]
    assert shown_tools(TOOLS_TEMPLATE, chat, [SCHEMA], "json") == (chat, [SCHEMA])
    shown, tools = shown_tools(TOOLS_TEMPLATE, chat, [SCHEMA], "plain")  # the plain style is never in a slot
    assert tools is None and "NAME(ARGUMENT)" in shown[0]["content"]
    assert shown_tools(TOOLS_TEMPLATE, "text", [SCHEMA], "json") == ("text", None)
