"""The batch that flows through one epoch (the interfaces that produce it: ``rlvr.batch.interfaces``).

Shapes: B prompts, G responses per prompt (the group), N = B*G responses (row
``b * G + g`` is response g of prompt b), P prompt tokens, T response tokens.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any

import torch


class CompletionIds(Sequence):
    """Each response's token ids without padding, as lists made when read: converting a batch's ids costs about
    200 ns a token, which a reward function that never reads them should not pay. Pickled: a plain list."""

    def __init__(self, response_ids: torch.Tensor, lengths: torch.Tensor) -> None:
        self.response_ids, self.lengths = response_ids, lengths  # [N, T], [N]

    def __len__(self) -> int:
        return self.response_ids.shape[0]

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return CompletionIds(self.response_ids[index], self.lengths[index])
        return self.response_ids[index, : int(self.lengths[index])].tolist()

    def __iter__(self) -> Iterator[list[int]]:
        return (row[:length] for row, length in zip(self.response_ids.tolist(), self.lengths.tolist()))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sequence) and list(self) == list(other)

    def __reduce__(self) -> tuple:
        return list, (list(self),)

    def __repr__(self) -> str:
        return repr(list(self))


@dataclass
class Samples:
    """What a policy returns from sampling G responses for each of B prompts.

    responses:        the responses in the task's own form, grouped by prompt (sorting: LongTensor [B, G, n];
                      text tasks: B lists of G strings); rewards are computed from these
    response_ids:     [N, T] long, the sampled tokens (padding where the mask is False)
    response_mask:    [N, T] bool, True on real response tokens (EOS included): what the policy scores as context
    prompt_ids:       [N, P] long, each response's prompt (left-padded for LMs)
    prompt_mask:      [N, P] bool, True on real prompt tokens
    sample_log_probs: [N, T] log-probs recorded while sampling (at the training temperature: the old policy's), or None
    policy_mask:      [N, T] bool, True on the tokens the policy sampled, the only ones that train (an episode's
                      environment tokens are in the response but not here). None when built: ``response_mask``
    truncated:        [R] bool, the rows cut at a length limit, or None (the policy cannot tell)
    episodes:         [R] long, non-decreasing: the response (row b*G + g of the grades) each row belongs to when
                      an episode trains as several sequences (a rewritten agent history), or None: R = N. Every
                      response has at least one row.
    token_versions:   [R, T] long, the weights version that sampled each token when a response went on with newer
                      weights mid-generation (``cluster.partial_rollouts``), or None: all by the batch's weights
    """

    responses: Any
    response_ids: torch.Tensor
    response_mask: torch.Tensor
    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    sample_log_probs: torch.Tensor | None = None
    policy_mask: torch.Tensor = None  # type: ignore[assignment]  # None: response_mask (__post_init__)
    truncated: torch.Tensor | None = None
    episodes: torch.Tensor | None = None
    token_versions: torch.Tensor | None = None

    def __post_init__(self) -> None:
        if self.policy_mask is None:
            self.policy_mask = self.response_mask

    @property
    def num_responses(self) -> int:
        """R: the rows (sequences that train)."""
        return self.response_ids.shape[0]

    @property
    def num_episodes(self) -> int:
        """N: the responses the rows belong to (graded, one delta each); R when each is one row."""
        if self.episodes is None:
            return self.num_responses
        return int(self.episodes[-1]) + 1 if len(self.episodes) else 0

    def per_row(self, values: torch.Tensor) -> torch.Tensor:
        """A response's value [N, ...] for each of its rows [R, ...]."""
        return values if self.episodes is None else values[self.episodes.to(values.device)]

    def per_episode(self, values: torch.Tensor) -> torch.Tensor:
        """Rows' values [R] summed over each response's rows [N]."""
        if self.episodes is None:
            return values
        total = torch.zeros(self.num_episodes, dtype=values.dtype, device=values.device)
        return total.index_add_(0, self.episodes.to(values.device), values)

    def completion_ids(self) -> Sequence[list[int]]:
        """Each response's tokens without padding (EOS included), N lists: TRL's ``completion_ids``
        (a response of several rows: theirs one after another)."""
        rows = CompletionIds(self.response_ids, self.response_mask.sum(dim=1))
        if self.episodes is None:
            return rows
        out: list[list[int]] = [[] for _ in range(self.num_episodes)]
        for episode, ids in zip(self.episodes.tolist(), rows):
            out[episode] += ids
        return out

    def rows(self, index: torch.Tensor | slice) -> Samples:
        """The responses at ``index`` ([n] or a slice; token tensors only, ``responses`` dropped)."""
        return Samples(None, **{name: _part(getattr(self, name), index) for name in _ROW_FIELDS})

    def narrow(self, width: int) -> Samples:
        """The first ``width`` response positions of every row (the rest must be padding)."""
        return replace(self, **{name: _part(getattr(self, name), (slice(None), slice(width)))
                                for name in _RESPONSE_FIELDS})

    def groups(self, index: torch.Tensor, group_size: int) -> Samples:
        """The groups (prompts) at ``index`` [k] with all their rows, responses numbered anew in that order."""
        if self.episodes is None:
            rows = (index.unsqueeze(1) * group_size + torch.arange(group_size)).reshape(-1)  # [k*G]
            part = self.rows(rows)
        else:
            starts, none = self.group_rows(group_size), torch.zeros(0, dtype=torch.long)  # [B + 1]: first rows
            ranges = [torch.arange(starts[b], starts[b + 1]) for b in index.tolist()]
            part = self.rows(torch.cat([none, *ranges]))
            part.episodes = torch.cat([none, *(self.episodes[r] + (k - b) * group_size
                                               for k, (b, r) in enumerate(zip(index.tolist(), ranges)))])
        part.responses = _pick(self.responses, index)
        return part

    def group_rows(self, group_size: int) -> torch.Tensor:
        """The first row of each group these rows hold, then R: [B + 1] for a whole batch. A learner's share keeps
        its responses' numbers; without ``episodes`` every G rows are a group (a partial last group is left out)."""
        if self.episodes is None:
            return torch.arange(0, (self.num_responses // group_size) * group_size + 1, group_size)
        group = self.episodes // group_size
        starts = torch.nonzero(group[1:] != group[:-1]).reshape(-1) + 1
        return torch.cat([torch.zeros(1, dtype=torch.long), starts, torch.tensor([self.num_responses])])

    @staticmethod
    def cat(parts: list[Samples]) -> Samples:
        """Several batches as one: responses padded on the right, prompts on the left (as an LM's are)."""
        if len(parts) == 1:
            return parts[0]
        episodes = None
        if any(s.episodes is not None for s in parts):  # each part's responses numbered after the parts before
            offsets = itertools.accumulate((s.num_episodes for s in parts), initial=0)
            episodes = torch.cat([(torch.arange(s.num_responses) if s.episodes is None else s.episodes) + offset
                                  for s, offset in zip(parts, offsets)])
        joined = {name: _pad_cat([getattr(s, name) for s in parts]) for name in _RESPONSE_FIELDS}
        truncated = [s.truncated for s in parts]
        return Samples(
            responses=_join([s.responses for s in parts]),
            prompt_ids=_pad_cat([s.prompt_ids for s in parts], left=True),
            prompt_mask=_pad_cat([s.prompt_mask for s in parts], left=True),
            truncated=None if any(t is None for t in truncated) else torch.cat(truncated),
            episodes=episodes,
            **joined,
        )

    def to_dict(self) -> dict[str, Any]:
        """Its fields as tensors and plain data: the form a checkpoint holds (``torch.load(weights_only=True)``)."""
        return {**{f.name: getattr(self, f.name) for f in fields(self)}, "responses": checkpoint_data(self.responses)}


# the fields indexed by row, and those of them with a response position axis [R, T] (None stays None)
_ROW_FIELDS = ("response_ids", "response_mask", "prompt_ids", "prompt_mask", "sample_log_probs", "policy_mask",
               "truncated", "episodes", "token_versions")
_RESPONSE_FIELDS = ("response_ids", "response_mask", "sample_log_probs", "policy_mask", "token_versions")


@dataclass
class Grades:
    """A task's verdict on B x G responses.

    rewards:  [B, G] float, NaN where the reward abstained
    correct:  [B, G] bool, the gold check
    metrics:  flat name -> number (per reward function: mean, errors, timeouts, ...)
    prompts:  the B prompts graded, in the task's form (None: not kept)
    failures: record name (``reward/<name>/failure``, ``episode/error``) -> the batch's first failure there, one line
    notes:    B lists of G notes, what the rewards said of each response ("" for none), or None
    """

    rewards: torch.Tensor
    correct: torch.Tensor
    metrics: dict[str, float]
    prompts: Any = None
    failures: dict[str, str] = field(default_factory=dict)
    notes: list[list[str]] | None = None

    def groups(self, index: torch.Tensor) -> Grades:
        """The groups (prompts) at ``index`` [k] (the metrics stay the whole batch's)."""
        return Grades(self.rewards[index], self.correct[index], self.metrics, _pick(self.prompts, index),
                      self.failures, _pick(self.notes, index))

    @staticmethod
    def cat(parts: list[Grades]) -> Grades:
        """Several batches as one; each metric the prompt-weighted mean over the batches that have it."""
        if len(parts) == 1:
            return parts[0]
        sizes = [g.rewards.shape[0] for g in parts]
        metrics: dict[str, float] = {}
        for key in dict.fromkeys(k for g in parts for k in g.metrics):
            have = [(g.metrics[key], b) for g, b in zip(parts, sizes) if key in g.metrics]
            metrics[key] = sum(v * b for v, b in have) / max(sum(b for _, b in have), 1)
        prompts = None if any(g.prompts is None for g in parts) else _join([g.prompts for g in parts])
        failures = {key: line for g in reversed(parts) for key, line in g.failures.items()}  # the first batch's wins
        notes = None
        if any(g.notes is not None for g in parts):
            notes = [row for g in parts for row in (g.notes or [[""] * g.rewards.shape[1]] * g.rewards.shape[0])]
        return Grades(torch.cat([g.rewards for g in parts]), torch.cat([g.correct for g in parts]), metrics, prompts,
                      failures, notes)


def contiguous_bounds(count: int, parts: int) -> list[tuple[int, int]]:
    """``parts`` contiguous ``[start, stop)`` ranges covering ``range(count)``, sizes differing by at most one."""
    cuts = [r * count // parts for r in range(parts + 1)]
    return list(zip(cuts[:-1], cuts[1:]))


def _pick(items: Any, index: torch.Tensor) -> Any:
    if items is None or isinstance(items, torch.Tensor):
        return _part(items, index)
    return [items[i] for i in index.tolist()]


def _part(x: torch.Tensor | None, index: Any) -> torch.Tensor | None:
    return None if x is None else x[index]


def checkpoint_data(value: Any) -> Any:
    """``value`` as what ``torch.load(weights_only=True)`` takes: containers as lists and dicts, a ``str`` subclass
    (an episode's text) as a plain ``str``, anything else that is no number as its text."""
    if isinstance(value, torch.Tensor) or value is None or isinstance(value, (bool, int, float)):
        return value
    if isinstance(value, str):
        return str(value)
    if isinstance(value, (list, tuple)):
        return [checkpoint_data(v) for v in value]
    if isinstance(value, dict):
        return {str(k): checkpoint_data(v) for k, v in value.items()}
    return str(value)


def _join(parts: list[Any]) -> Any:
    return torch.cat(parts) if isinstance(parts[0], torch.Tensor) else [x for part in parts for x in part]


def _pad_cat(parts: list[torch.Tensor | None], left: bool = False) -> torch.Tensor | None:
    """[n_i, T_i] tensors -> [sum n_i, max T_i], zero-padded on the right (or left); None if any part is None."""
    if any(t is None for t in parts):
        return None
    width = max(t.shape[1] for t in parts)
    return torch.cat([torch.nn.functional.pad(t, (width - t.shape[1], 0) if left else (0, width - t.shape[1]))
                      for t in parts])


@dataclass
class Rollout:
    """One epoch's batch, reused by each of its inner steps.

    samples:       the sampled responses (N = B*G, in R rows, ``Samples.episodes``); every [N]/[N, T] below is per row
    deltas:        [N] per-response deltas (0 where the reward abstained), each row its response's
    old_log_probs: [N, T] log-probs of the policy that sampled them, or None (naive loss)
    ref_log_probs: [N, T] log-probs under the frozen reference, or None (no KL penalty)
    weights:       [N, T] per-token aggregation weights (sum(w * loss) is the loss)
    stats:         epoch-level numbers: rewards, solve rate, reward metrics, timings
    importance_weights: [N, T] the policy-gradient term's off-policy weights (TIS: min(pi_old / pi_sampler, C);
                   0 on masked tokens), or None
    prompt_solved: each prompt's share of responses that pass the gold check, or None (prompts not kept)
    pg_token_mask: [N, T] bool, the tokens whose policy-gradient term trains (top-entropy selection), or None (all).
                   Not in ``weights``: the aggregation's normaliser and the KL term keep every response token.
    """

    samples: Samples
    deltas: torch.Tensor
    old_log_probs: torch.Tensor | None
    ref_log_probs: torch.Tensor | None
    weights: torch.Tensor
    stats: dict[str, Any]
    importance_weights: torch.Tensor | None = None  # defaulted: checkpoints from before it load
    prompt_solved: dict[str, float] | None = None
    pg_token_mask: torch.Tensor | None = None

    def rows(self, index: slice) -> Rollout:
        """The responses at ``index`` (a slice: views) with all that goes with them; the aggregation weights stay
        the whole batch's, so the parts' losses add up to the whole's (micro-batches, data-parallel shares)."""
        return replace(self, samples=self.samples.rows(index), **{name: _part(getattr(self, name), index) for name in (
            "deltas", "old_log_probs", "ref_log_probs", "weights", "importance_weights", "pg_token_mask")})

    def to_dict(self) -> dict[str, Any]:
        """Nested dicts of tensors and plain data: the form a checkpoint holds."""
        return {**{f.name: getattr(self, f.name) for f in fields(self)}, "samples": self.samples.to_dict()}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Rollout:
        return cls(**{**data, "samples": Samples(**data["samples"])})
