"""Generation back ends behind one narrow interface (``rlvr.engines.base.Engine``).

hf.py decodes in this process with a transformers KV cache, sharing the trainer's module; vllm.py runs vLLM in
this process with its own copy of the weights (the ``vllm`` extra, imported only when asked for).
"""

from rlvr.engines.base import Engine, Generation, SamplingParams

# policy.options.engine: hf (in-process, sharing the trainer's module) or vllm (its own copy)
ENGINES = ("hf", "vllm")


class WeightSyncError(RuntimeError):
    """An engine's weights are not the trainer's after a weight sync (the probe disagrees)."""


__all__ = ["ENGINES", "Engine", "Generation", "SamplingParams", "WeightSyncError"]
