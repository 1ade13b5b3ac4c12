"""rlvr: reinforcement learning from verifiable rewards.

``rlvr.train(config, reward_funcs=[...], out_dir=...)`` trains and returns a
``TrainResult``; ``rlvr.check(config)`` makes the checks a run makes before loading the
model (``rlvr.api``). The training loop itself is ``rlvr.loop.trainer.train``.
"""

from rlvr.api import TrainResult, check, train
from rlvr.config import Config, ConfigError, load_config

__version__ = "0.1.0"
__all__ = ["Config", "ConfigError", "TrainResult", "check", "load_config", "train", "__version__"]
