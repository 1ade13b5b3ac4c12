"""The Ray actors a run builds, recorded so that a test's callback can reach them."""

from __future__ import annotations


def record_actors(monkeypatch) -> list:
    """Every ``RayRolloutSource`` and ``LearnerGroup`` built from now on in the test, in order
    (``built[-1].worker_pids()`` from an ``on_epoch_end``)."""
    from rlvr.cluster.learners import LearnerGroup
    from rlvr.cluster.rollout import RayRolloutSource

    built = []
    for cls in (RayRolloutSource, LearnerGroup):
        def recording_init(self, *args, _init=cls.__init__, **kwargs):
            _init(self, *args, **kwargs)
            built.append(self)

        monkeypatch.setattr(cls, "__init__", recording_init)
    return built
