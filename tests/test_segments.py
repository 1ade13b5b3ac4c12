"""Responses that train as several sequences (``Samples.episodes``): an agent episode whose
history was rewritten is one row per segment, each with its response's delta; groups,
concatenation and per-response sums follow the rows, and a batch without split responses
is laid out and trained exactly as before."""

import torch

from rlvr.batch.rollout import Samples
from rlvr.environments.base import Episode, Turn
from rlvr.environments.episodes import episodes_samples


def episode(prompt, *segments):
    """An episode: its first segment's policy turn ``prompt -> [7, 8]``, then more (prompt, ids)."""
    more = [(list(p), [Turn("policy", "y", list(ids), [-0.5] * len(ids))]) for p, ids in segments]
    return Episode(start=0, prompt="p", prompt_ids=list(prompt), turns=[Turn("policy", "x", [7, 8], [-1.0, -2.0])],
                   more_segments=more)


def test_a_split_episode_is_one_row_per_segment_and_the_rest_one_row_each():
    episodes = [episode([1, 2]), episode([1, 2], ([3, 4, 5], [9])), episode([6]), episode([6], ([4], [5, 5, 5]))]
    samples = episodes_samples(episodes, 2, 0)
    assert samples.episodes.tolist() == [0, 1, 1, 2, 3, 3] and samples.num_episodes == 4
    assert samples.num_responses == 6 and [len(group) for group in samples.responses] == [2, 2]
    assert samples.response_ids[2, :1].tolist() == [9] and samples.prompt_ids[2].tolist() == [3, 4, 5]
    assert samples.policy_mask.sum(dim=1).tolist() == [2, 2, 1, 2, 2, 3]
    assert samples.per_row(torch.tensor([10.0, 11, 12, 13])).tolist() == [10, 11, 11, 12, 13, 13]
    assert samples.per_episode(torch.tensor([1, 2, 3, 4, 5, 6])).tolist() == [1, 5, 4, 11]
    assert samples.group_rows(2).tolist() == [0, 3, 6]
    assert samples.rows(slice(1, 6)).group_rows(2).tolist() == [0, 2, 5]  # a share: the groups it holds
    assert samples.rows(slice(3, 6)).group_rows(2).tolist() == [0, 3]
    assert [str(t) for t in samples.responses[0]] == ["x", "xy"]  # reward functions read every segment's text
    # the second group, then the first: all their rows, the responses numbered in that order
    part = samples.groups(torch.tensor([1, 0]), 2)
    assert part.episodes.tolist() == [0, 1, 1, 2, 3, 3] and part.prompt_ids[0, -1].item() == 6
    assert part.responses == [samples.responses[1], samples.responses[0]]
    both = Samples.cat([samples, episodes_samples(episodes[:2], 2, 0)])
    assert both.episodes.tolist() == [0, 1, 1, 2, 3, 3, 4, 5, 5] and both.num_episodes == 6
    assert episodes_samples(episodes[::2], 2, 0).episodes is None  # none split: one row each, as before


def test_build_rollout_gives_each_row_its_responses_delta(tiny_model):
    from types import SimpleNamespace

    from rlvr.batch.rollout import Grades
    from rlvr.config import config_from_dict
    from rlvr.loop.trainer import build_rollout

    config = config_from_dict({"algo": {"group_size": 2, "deltas": "centered", "loss": "naive"}})
    samples = episodes_samples([episode([1, 2]), episode([1, 2], ([3, 4, 5], [9])), episode([6]),
                                episode([6], ([4], [5, 5, 5]))], 2, 0)
    grades = Grades(torch.tensor([[1.0, 0.0], [0.0, 0.5]]), torch.zeros(2, 2, dtype=torch.bool), {})
    policy = SimpleNamespace(max_response_length=8, truncated=lambda s: s.truncated)

    class Learner:
        def log_probs(self, *args, **kwargs):
            raise AssertionError("the naive loss needs no log-probs")

    st = SimpleNamespace(policy=policy)
    rollout = build_rollout(config, st, samples, grades, {"time/generate": 1.0}, Learner())
    assert rollout.deltas.tolist() == [0.5, -0.5, -0.5, -0.25, 0.25, 0.25]  # centered per group, per row
    assert rollout.weights.shape == (6, samples.response_ids.shape[1])


def test_an_agent_episode_past_the_segment_cap_abstains_named():
    from types import SimpleNamespace

    from rlvr.agents.calls import Call
    from rlvr.agents.runner import MAX_SEGMENTS, episode_of

    calls = [Call([k, k], [7], [-1.0], "x") for k in range(MAX_SEGMENTS + 1)]  # no call extends another
    record = SimpleNamespace(calls=calls, prompt="p", truncated=False)  # the endpoint's record, as episode_of reads it
    run = episode_of({}, record, 1.0, None)
    assert run.segments == MAX_SEGMENTS + 1 and run.error == (
        f"its {MAX_SEGMENTS + 1} calls split into {MAX_SEGMENTS + 1} segments, more than the {MAX_SEGMENTS} an "
        "episode may train as (each a row of the batch)")
    record.calls = record.calls[:MAX_SEGMENTS]
    run = episode_of({}, record, 1.0, None)
    assert run.error is None and len(run.more_segments) == MAX_SEGMENTS - 1
