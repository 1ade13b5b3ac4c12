"""A verifiers taskset, written in verifiers' own style (``vf init``'s layout): sums to
answer, rewarded by a ``@vf.reward``. rlvr trains on it unchanged with
``task.name: verifiers`` (``examples/verifiers_arithmetic.yaml``)."""

from .taskset import ArithmeticConfig, ArithmeticData, ArithmeticTask, ArithmeticTaskset

__all__ = ["ArithmeticConfig", "ArithmeticData", "ArithmeticTask", "ArithmeticTaskset"]
