"""Batches sampled ahead of the trainer, in the form a checkpoint holds them.

With ``cluster.max_staleness = k >= 1`` every checkpoint but the run's last falls while the next epochs' batches are
in flight, sampled with weights the checkpoint no longer holds. ``RayRolloutSource.state`` waits for them and keeps
each batch (or part, ``cluster.split_batch``) here as tensors and plain data (``torch.load(weights_only=True)``) with
its epoch, the weights version it was sampled with and the epoch at whose start the driver held those weights. A
resumed source trains on them as they are: a run killed and resumed gives the straight run's records.

What leaves the batch: the responses' task-specific objects (an episode becomes its text, as in a checkpoint's
``Rollout``) and the graded prompts, kept as their record keys (``rlvr.loop.diagnostics.prompt_key``), all the loop
reads of them after grading.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from rlvr.batch.rollout import Grades, Samples, checkpoint_data
from rlvr.loop.diagnostics import prompt_key

JOB_FIELDS = ("epoch", "worker", "version", "weights_epoch")  # a batch's place, and the weights it was sampled with


def batch_to_dict(job: Any) -> dict[str, Any]:
    """A graded batch (a ``rollout.Job`` with its result) as checkpoint data."""
    samples, grades, stats = job.result
    out_grades = {f.name: getattr(grades, f.name) for f in dataclasses.fields(grades)}
    out_grades["prompts"] = None if grades.prompts is None else [prompt_key(p) for p in grades.prompts]
    out_grades["metrics"], out_grades["failures"] = checkpoint_data(grades.metrics), checkpoint_data(grades.failures)
    return {**{key: getattr(job, key) for key in JOB_FIELDS}, "samples": samples.to_dict(), "grades": out_grades,
            "stats": checkpoint_data(stats)}


def batch_from_dict(data: dict[str, Any]) -> tuple[dict[str, int], tuple[Samples, Grades, dict[str, float]]]:
    """``batch_to_dict``'s data back: the job's fields, and its result (samples, grades, stats)."""
    return ({key: data[key] for key in JOB_FIELDS},
            (Samples(**data["samples"]), Grades(**data["grades"]), dict(data["stats"])))
