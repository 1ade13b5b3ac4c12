"""A verifiers taskset of two turns, in verifiers' own style: a sum, then the taskset's
user asks to add a number to the reply (its ``Env`` plays the user); a ``@vf.reward``
scores the last reply. rlvr trains on it unchanged with ``task.name: verifiers``, both
calls joined into one training sequence."""

from .taskset import FollowupConfig, FollowupData, FollowupEnv, FollowupEnvConfig, FollowupTask, FollowupTaskset

__all__ = ["FollowupConfig", "FollowupData", "FollowupEnv", "FollowupEnvConfig", "FollowupTask", "FollowupTaskset"]
