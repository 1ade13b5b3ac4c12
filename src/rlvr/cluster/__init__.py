"""The same loop, other seams: the rollout source and the learner as Ray actors.

``cluster.rollout_workers > 0``: Ray actors sample and grade each batch (``rollout.RayRolloutSource``);
``cluster.learners > 1``: data-parallel learners take the steps (``learners.LearnerGroup``); ``session.loop_parts``
builds the pair the loop receives. Nothing here imports the loop, nor Ray until a run asks for actors (``pip install
'rlvr[ray]'``). Every wait on an actor is bounded (``cluster.call_timeout``, ``READY_TIMEOUT``, ``PROBE_TIMEOUT``;
docs/explanation/cluster.md)."""

from __future__ import annotations

from rlvr.base.errors import RunError

READY_TIMEOUT = 300.0  # seconds an actor may take to start (build its policy), or to come back after a restart
PROBE_TIMEOUT = 5.0  # seconds a learner that missed its deadline may take to say what it is doing


class ClusterError(RunError):
    """The rollout workers cannot go on (restarts used up, a call timed out, Ray failed): the run stops with one line
    (``rlvr: error: ...``, exit 2)."""


def quiet_actor() -> None:
    """In a Ray actor: no transformers progress bars (Ray prints an actor's output line by line behind its prefix,
    so a bar's carriage returns arrive as raw text)."""
    try:
        from transformers.utils import logging as hf_logging
    except ImportError:
        return
    hf_logging.disable_progress_bar()


def first_line(err: BaseException) -> str:
    """An error's first line, or its type's name if it has no text (Ray's errors run to pages)."""
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def stopped(where: str, err: BaseException) -> ClusterError:
    """The one line that stops the run: where, and the cause (Ray's own errors named as such: a node that died)."""
    cause = first_line(err) if isinstance(err, ClusterError) else f"Ray failed: {type(err).__name__}: {first_line(err)}"
    return ClusterError(f"{where}: {cause}. The run stops; the checkpoints written before are intact "
                        "(resume=RUN_DIR continues from the last one)")
