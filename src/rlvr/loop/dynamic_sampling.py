"""DAPO's dynamic sampling: a batch of groups that all carry a gradient.

A group whose deltas are all zero (every response right, or every one wrong, under a group baseline) adds nothing to the
policy gradient but its share of the batch: the step shrinks as the policy gets a prompt always right or always wrong,
and a run can stall. Dynamic sampling keeps only the groups with a nonzero delta and samples more batches until it has B
of them, at most ``algo.max_sampling_tries`` batches an epoch; if those are spent, groups with zero deltas fill the
rest, so every batch has B groups. B is the size of a batch as the task draws it: ``task.prompts_per_epoch``, or the
whole list of fixed prompts (each try samples the list again), as without dynamic sampling.

    dynamic/tries                batches sampled this epoch
    dynamic/learning_groups_frac share of the B groups with a nonzero delta before any filling
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from rlvr import core
from rlvr.batch.rollout import Grades, Samples
from rlvr.config import AlgoConfig

Sample = Callable[[], tuple[Samples, Grades, dict[str, float]]]


def fill_with_learning_groups(a: AlgoConfig, sample: Sample) -> tuple[Samples, Grades, dict[str, float]]:
    """B groups from repeated calls of ``sample`` (each: B groups graded, and their timings; B is the first call's):
    those with a nonzero delta first, in the order sampled, then zero-delta groups; the timings added up."""
    learning: list[tuple[Samples, Grades]] = []
    idle: list[tuple[Samples, Grades]] = []
    found, tries, timings, num_groups = 0, 0, {}, None
    while (num_groups is None or found < num_groups) and tries < a.max_sampling_tries:
        samples, grades, t = sample()
        tries += 1
        if num_groups is None:  # the batch's size, as the task draws it (fixed prompts: the whole list)
            num_groups = grades.rewards.shape[0]
        for key, value in t.items():
            timings[key] = timings.get(key, 0.0) + value
        deltas = core.compute_deltas(grades.rewards, a.deltas, eps=a.adv_eps).reshape(-1)  # [B*G]
        keep = core.nonzero_delta_groups(deltas, a.group_size)  # [B]
        kept, dropped = keep.nonzero().squeeze(1), (~keep).nonzero().squeeze(1)
        learning.append((samples.groups(kept, a.group_size), grades.groups(kept)))
        idle.append((samples.groups(dropped, a.group_size), grades.groups(dropped)))
        found += len(kept)
    parts = [part for part in learning + idle if part[1].rewards.shape[0] > 0]
    samples, grades = Samples.cat([s for s, _ in parts]), Grades.cat([g for _, g in parts])
    first = torch.arange(num_groups)  # the learning groups first, then idle ones to fill
    stats = {**timings, "dynamic/tries": float(tries),
             "dynamic/learning_groups_frac": min(found, num_groups) / num_groups}
    return samples.groups(first, a.group_size), grades.groups(first), stats
