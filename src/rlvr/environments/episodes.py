"""Running episodes: every active episode's next turn in one batch, until each ends.

Shapes: B starts, G episodes per start (the group), N = B*G episodes (row ``b * G + g`` is
episode g of start b), P prompt tokens (left-padded), T tokens after the prompt
(right-padded), the policy's and the environment's.

Each turn, the episodes still running are continued from their token prefixes in one call
to the policy's engine; each episode draws from its own seed, so a batch gives the episodes
that one-at-a-time sampling gives. A turn that calls tools gets their results (at most
``max_tool_calls`` run); any other turn goes to its environment's ``step``, each kind of
call to every episode's environment at once (``EnvironmentHosts``). An episode ends when its
environment says done, or truncated at ``max_turns`` policy turns or ``max_tokens`` tokens.

``episodes_samples`` lays the episodes out as ``Samples``: the response is every token after
the prompt, and ``policy_mask`` marks the policy's, the only ones trained.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from rlvr.batch.rollout import Samples
from rlvr.environments.base import Episode, EpisodeText, Observation, ToolCall, ToolResult, Turn
from rlvr.environments.calls import as_observation, episode_chars
from rlvr.environments.workers import EnvironmentFailed, EnvironmentHosts
from rlvr.policies import turns
from rlvr.policies.prompts import content_chars

if TYPE_CHECKING:
    from rlvr.environments.tools import ToolBox
    from rlvr.policies.causal_lm import CausalLMPolicy

SEED_RANGE = 2**62


@dataclass(frozen=True)
class EpisodeLimits:
    """When an episode ends if its environment has not ended it (truncated), and its calls' limits."""

    max_turns: int = 4  # policy turns
    max_tokens: int = 256  # tokens after the prompt, the policy's and the environment's together
    tool_style: str = "plain"  # how tool calls are written (``rlvr.environments.tool_parsing``)
    step_timeout: float | None = 30.0  # seconds one call into environment code may take (make, reset, step, tools())
    tool_timeout: float | None = None  # seconds one call of an environment's own tool may take
    max_tool_calls: int = 8  # per policy turn; the policy reads one failed result for those past it


class _Running:
    """One episode while it runs: its row in the hosts, its environment's class name, for a chat its messages
    so far (``shown``: the prompt as rendered, its tools described) and the tools its chat template gets."""

    def __init__(self, episode: Episode, row: int, name: str = "environment", shown: Observation | None = None,
                 tools: list[dict] | None = None) -> None:
        self.episode, self.row, self.name, self.tools = episode, row, name, tools
        self.chat = not isinstance(episode.prompt, str)
        shown = episode.prompt if shown is None else shown
        self.history: list[dict[str, Any]] = [dict(m) for m in shown] if self.chat else []

    def observation(self, observation: Observation) -> Observation:
        """``observation`` in this episode's form: text for a text episode, messages for a chat."""
        return as_observation(observation, self.chat, self.name)

    def fail(self, failed: EnvironmentFailed) -> None:
        self.episode.error, self.episode.done = str(failed), True


def run_episodes(policy: CausalLMPolicy, hosts: EnvironmentHosts, starts: Sequence[Any], group_size: int,
                 temperature: float, generator: torch.Generator | None, limits: EpisodeLimits,
                 toolbox: ToolBox | None = None, seeds: torch.Tensor | None = None) -> list[Episode]:
    """G episodes from each of B ``starts`` (rows or seeds), N in all (row ``b*G + g``). ``temperature`` 0:
    greedy; else each episode draws from its own seed: ``seeds`` [N] long, or N drawn from ``generator``."""
    running = start_episodes(policy, hosts, [start for start in starts for _ in range(group_size)],
                             [b for b in range(len(starts)) for _ in range(group_size)], limits)
    episodes = [r.episode for r in running]
    if temperature > 0 and seeds is None:
        if generator is None:
            raise ValueError("sampling episodes with temperature > 0 needs a torch.Generator")
        seeds = torch.randint(SEED_RANGE, (len(running),), generator=generator)
    active = list(range(len(running)))
    for turn in range(limits.max_turns):
        active = [i for i in active if not episodes[i].done]
        if not active:
            break
        _policy_turns(policy, [running[i] for i in active], temperature, limits,
                      None if seeds is None else _turn_seeds(seeds[active], turn))
        _run_tools_or_step(policy, hosts, [running[i] for i in active if not episodes[i].done], limits, toolbox)
    for episode in episodes:
        if not episode.done:  # the turn limit
            episode.done = episode.truncated = True
    _final_rewards(hosts, [r for r in running if r.episode.truncated and r.episode.error is None], limits)
    _snapshots(hosts, [r for r in running if r.episode.error is None], limits)
    return episodes


def _snapshots(hosts: EnvironmentHosts, ended: list[_Running], limits: EpisodeLimits) -> None:
    """Each ended episode's ``environment`` (reward functions' ``environments``); None where it failed."""
    if ended:
        for r, outcome in zip(ended, hosts.call([(r.row, "snapshot", ()) for r in ended], limits.step_timeout)):
            r.episode.environment = None if isinstance(outcome, EnvironmentFailed) else outcome


def _final_rewards(hosts: EnvironmentHosts, ended: list[_Running], limits: EpisodeLimits) -> None:
    """The reward of truncated episodes from their environments' state where they have one (``final_reward``:
    a TRL-style class's ``get_reward``), as an environment turn of no tokens."""
    if not ended:
        return
    for r, outcome in zip(ended, hosts.call([(r.row, "final", ()) for r in ended], limits.step_timeout)):
        if isinstance(outcome, EnvironmentFailed):
            r.fail(outcome)
        elif outcome is not None:
            reward, solved = outcome
            r.episode.turns.append(Turn("environment", "", [], reward=reward))
            if solved is not None:
                r.episode.solved = solved


def start_episodes(policy: CausalLMPolicy, hosts: EnvironmentHosts, starts: Sequence[Any], indices: Sequence[int],
                   limits: EpisodeLimits) -> list[_Running]:
    """Episode ``i``'s environment made and reset from ``starts[i]`` in ``hosts`` (row ``i``), all at once; one
    that fails ends its episode with the error. ``indices`` name the starts in a prompt error. What crosses
    from the environments from here on is cut past what an episode could hold (``episode_chars``)."""
    from rlvr.environments.tool_parsing import shown_tools

    hosts.max_chars = episode_chars(limits.max_tokens, policy.max_positions, policy.tokenizer)
    requests = [request for row, start in enumerate(starts)
                for request in ((row, "make", ()), (row, "reset", (copy.deepcopy(start),)), (row, "schemas", ()))]
    outcomes = hosts.call(requests, limits.step_timeout)
    template = getattr(policy.tokenizer, "chat_template", None) and policy.tokenizer.get_chat_template()
    running = []
    for row, start in enumerate(starts):
        name, prompt, schemas = outcomes[3 * row:3 * row + 3]
        failed = next((o for o in (name, prompt, schemas) if isinstance(o, EnvironmentFailed)), None)
        if failed is not None:
            running.append(_Running(Episode(start=start, prompt="", prompt_ids=[], done=True, error=str(failed)), row))
            continue
        shown, tools = shown_tools(template, prompt, schemas, limits.tool_style)
        ids = turns.first_prompt_ids(policy, shown, indices[row], limits.max_tokens, tools)
        running.append(_Running(Episode(start=start, prompt=prompt, prompt_ids=ids), row, name, shown, tools))
    return running


def _turn_seeds(seeds: torch.Tensor, turn: int) -> torch.Tensor:
    """Each episode's seed for ``turn``: its seed and the turn mixed (SplitMix64)."""
    from rlvr.engines.hf import keyed_uniforms

    return (keyed_uniforms(seeds, turn * 1_000_003).squeeze(-1) * SEED_RANGE).long()


def _policy_turns(policy: CausalLMPolicy, active: list[_Running], temperature: float, limits: EpisodeLimits,
                  seeds: torch.Tensor | None) -> None:
    """The next policy turn of every active episode (batched by ``turn_calls``); one out of tokens ends truncated."""
    room = [limits.max_tokens - r.episode.length for r in active]
    prefixes = [r.episode.prompt_ids + r.episode.response_ids for r in active]
    calls = turn_calls([len(p) for p in prefixes], room, policy.sampling.max_new_tokens, policy.max_positions)
    for rows, max_new in calls:
        generation, texts = turns.next_turns(policy, [prefixes[i] for i in rows], temperature, max_new,
                                             None if seeds is None else seeds[rows])
        lengths, ids, log_probs = generation.lengths.tolist(), generation.response_ids.tolist(), \
            generation.sample_log_probs.tolist()
        for k, row in enumerate(rows):
            r, length, text = active[row], lengths[k], texts[k]
            if length > room[row]:  # past the episode's budget: cut there
                length = room[row]
                text = policy.tokenizer.decode(ids[k][:length], skip_special_tokens=True)
            r.episode.turns.append(Turn("policy", text, ids[k][:length], log_probs[k][:length]))
            if r.chat:
                r.history.append({"role": "assistant", "content": text})
            if r.episode.length >= limits.max_tokens:
                r.episode.done = r.episode.truncated = True


def turn_calls(prefix_lengths: list[int], room: list[int], max_new_tokens: int, max_positions: int | None
               ) -> list[tuple[list[int], int]]:
    """One turn's engine calls: (rows, tokens drawn at most). A call draws as many tokens as the roomiest of its
    rows may take (each row is cut to its own room after); a row whose prefix would then pass ``max_positions``
    waits for a later call that draws fewer. A prompt leaves room for its ``max_tokens`` (``first_prompt_ids``),
    so the roomiest row left always fits."""
    calls, left = [], list(range(len(room)))
    while left:
        max_new = max(1, min(max_new_tokens, max(room[i] for i in left)))
        fits = [i for i in left if max_positions is None or prefix_lengths[i] + max_new <= max_positions] or left
        calls.append((fits, max_new))
        taken = set(fits)
        left = [i for i in left if i not in taken]
    return calls


def _run_tools_or_step(policy: CausalLMPolicy, hosts: EnvironmentHosts, active: list[_Running], limits: EpisodeLimits,
            toolbox: ToolBox | None) -> None:
    """Each episode's reply to its policy turn: tool results for a turn that calls tools, else its environment's
    step; appended as token ids when the budget has room."""
    from rlvr.environments.tool_parsing import call_arguments, format_tool_results, parse_tool_calls

    listed = hosts.call([(r.row, "tools", ()) for r in active], limits.step_timeout)
    own_calls: list[tuple[int, ToolCall]] = []  # (row, call) for the environments' own tools
    boxed: list[tuple[int, ToolCall]] = []  # (row, call) for the task's sandboxed tools
    results: list[list[ToolResult]] = [[] for _ in active]
    calling = []
    over_cap: dict[int, ToolResult] = {}  # row -> the failed result that says which calls were not run
    for row, (r, own) in enumerate(zip(active, listed)):
        if isinstance(own, EnvironmentFailed):
            r.fail(own)
            continue
        known = set(own) | (set(toolbox.names) if toolbox is not None else set())
        turn = r.episode.turns[-1]
        calls, errors = parse_tool_calls(turn.text, limits.tool_style, known) if known else ([], [])
        if not calls and not errors:
            continue
        calling.append(row)
        if len(calls) > limits.max_tool_calls:
            over_cap[row] = _not_run(calls[limits.max_tool_calls:], limits.max_tool_calls)
            calls = calls[:limits.max_tool_calls]
        turn.tool_calls = list(calls)
        results[row] = list(errors)
        for call in calls:
            (own_calls if call.name in own else boxed).append((row, call))
    if own_calls:  # failures are the policy's to read
        requests = [(active[row].row, "tool", (call.name, *call_arguments(call.arguments))) for row, call in own_calls]
        for (row, call), outcome in zip(own_calls, hosts.call(requests, limits.tool_timeout)):
            results[row].append(ToolResult(call.name, str(outcome).removeprefix(f"{call.name}: "), error=True)
                                if isinstance(outcome, EnvironmentFailed) else ToolResult(call.name, outcome))
    if boxed:
        for (row, _), result in zip(boxed, toolbox.run([call for _, call in boxed])):
            results[row].append(result)
    for row, result in over_cap.items():
        results[row].append(result)
    stepping = [r for row, r in enumerate(active) if row not in calling and not r.episode.done]
    for r, stepped in zip(stepping, hosts.call([(r.row, "step", (r.episode.turns[-1].text, r.chat)) for r in stepping],
                                               limits.step_timeout)):
        _step(policy, r, stepped, limits)
    for row, r in enumerate(active):
        if r.episode.done or row not in calling:  # its tools() failed, or it stepped
            continue
        reply = Turn("tool", "", [], tool_results=results[row])
        if r.chat:
            _append(policy, r, reply, [{"role": "tool", "name": res.name, "content": res.content}
                                       for res in results[row]], limits)
        else:
            _append(policy, r, reply, format_tool_results(results[row], limits.tool_style), limits)


def _not_run(skipped: list[ToolCall], cap: int) -> ToolResult:
    """The failed result a turn's calls past the cap get (one for all: the policy reads why)."""
    return ToolResult(skipped[0].name, f"{len(skipped)} more tool call{'s' * (len(skipped) > 1)} not run: at most "
                      f"{cap} tool calls a turn", error=True)


def _step(policy: CausalLMPolicy, r: _Running, stepped: Any, limits: EpisodeLimits) -> None:
    """The environment's answer to a turn without tool calls. A step that failed ends the episode with its
    ``error`` (counted; its reward abstains): one broken episode does not stop a run."""
    if isinstance(stepped, EnvironmentFailed):
        r.fail(stepped)
        return
    reward, done, solved, observation = stepped
    if solved is not None:
        r.episode.solved = solved
    turn = Turn("environment", "", [], reward=reward)
    r.episode.done = done
    if observation is None:  # nothing (more) to read
        r.episode.turns.append(turn)
        return
    _append(policy, r, turn, observation, limits)


def _append(policy: CausalLMPolicy, r: _Running, turn: Turn, observation: Observation, limits: EpisodeLimits
            ) -> None:
    """Add the reply ``turn`` with ``observation``'s token ids; one past the token budget ends the episode
    truncated (no room left for the policy to answer it)."""
    room = limits.max_tokens - r.episode.length
    closing = []  # a chat turn cut at max_new_tokens gets its end-of-turn token first, as the template writes it
    if r.chat and r.episode.turns and r.episode.turns[-1].trained:
        closing = turns.end_of_turn_ids(policy, r.episode.turns[-1].ids)
    text, ids = turns.observation_ids(policy, r.history, observation, room - len(closing), r.tools)
    if ids is not None and closing:
        text, ids = policy.tokenizer.eos_token + text, closing + ids
    if ids is None:
        turn.note = (f"an observation of {content_chars(observation)} characters, more than the {room} tokens "
                     "left could hold: not encoded, the episode ends truncated")
    if ids is None or r.episode.length + len(ids) >= limits.max_tokens:
        r.episode.done = r.episode.truncated = True
    else:
        turn.text, turn.ids = text, ids
    if r.chat:
        r.history.extend(dict(m) for m in observation)
    r.episode.turns.append(turn)


def episodes_samples(episodes: Sequence[Episode], group_size: int, pad_id: int) -> Samples:
    """The episodes as ``Samples``: prompts left-padded [R, P], every token after the prompt right-padded [R, T],
    ``policy_mask`` on the policy's tokens (with their sampler log-probs), ``truncated`` [R], ``responses`` B lists
    of G ``EpisodeText``. An episode is one row, or one per segment (``more_segments``: then ``episodes`` [R]
    says which episode each row is of)."""
    sequences = [(i, prompt, segment) for i, e in enumerate(episodes)
                 for prompt, segment in ((e.prompt_ids, e.turns), *e.more_segments)]
    n = len(sequences)
    width = max(1, max(sum(len(t.ids) for t in segment) for _, _, segment in sequences))
    prompt_width = max(len(prompt) for _, prompt, _ in sequences)
    prompt_ids = torch.full((n, prompt_width), pad_id, dtype=torch.long)
    prompt_mask = torch.zeros((n, prompt_width), dtype=torch.bool)
    response_ids = torch.full((n, width), pad_id, dtype=torch.long)
    response_mask = torch.zeros((n, width), dtype=torch.bool)
    policy_mask = torch.zeros((n, width), dtype=torch.bool)
    log_probs = torch.zeros((n, width))
    for row, (_, prompt, segment) in enumerate(sequences):
        if prompt:
            prompt_ids[row, prompt_width - len(prompt):] = torch.tensor(prompt)
            prompt_mask[row, prompt_width - len(prompt):] = True
        at = 0
        for turn in segment:
            end = at + len(turn.ids)
            if turn.ids:
                response_ids[row, at:end] = torch.tensor(turn.ids)
            if turn.trained and turn.ids:
                policy_mask[row, at:end] = True
                log_probs[row, at:end] = torch.tensor(turn.log_probs)
            at = end
        response_mask[row, :at] = True
    texts = [EpisodeText(e) for e in episodes]
    split = n > len(episodes)
    return Samples(
        responses=[texts[b:b + group_size] for b in range(0, len(episodes), group_size)],
        response_ids=response_ids, response_mask=response_mask, prompt_ids=prompt_ids, prompt_mask=prompt_mask,
        sample_log_probs=log_probs, policy_mask=policy_mask,
        truncated=torch.tensor([episodes[i].truncated for i, _, _ in sequences], dtype=torch.bool),
        episodes=torch.tensor([i for i, _, _ in sequences]) if split else None,
    )
