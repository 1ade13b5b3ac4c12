"""Generation back ends behind one narrow interface (``rlvr.engines.base.Engine``).

base.py: ``SamplingParams``, the ``Generation`` result and the ``Engine`` protocol;
hf.py: ``HFEngine``, decoding in this process with a transformers KV cache.
"""

from rlvr.engines.base import Engine, Generation, SamplingParams

__all__ = ["Engine", "Generation", "SamplingParams"]
