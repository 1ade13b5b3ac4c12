"""rlvr: reinforcement learning from verifiable rewards."""

from rlvr.config import Config, ConfigError, load_config
from rlvr.trainer import train

__version__ = "0.1.0"
__all__ = ["Config", "ConfigError", "load_config", "train", "__version__"]
