"""The same loop, other seams: the rollout source and the learner as Ray actors.

``cluster.rollout_workers > 0`` has Ray actors (``rollout.RolloutWorker``) sample and grade
each epoch's batch with the trainer's current weights (``rollout.RayRolloutSource``);
``cluster.learners > 1`` has data-parallel learners take the optimizer steps
(``learners.LearnerGroup``, each running ``rlvr.step``). ``session.loop_parts`` builds the
pair the loop receives. Nothing here imports the loop (``rlvr.trainer``). Ray is optional:
``pip install 'rlvr[ray]'``; nothing here imports it until a run asks for actors.
"""

from rlvr.errors import RunError


class ClusterError(RunError):
    """The rollout workers cannot go on (restarts used up, a call timed out, Ray itself
    failed): the run stops with one line (``rlvr: error: ...``, exit 2)."""
