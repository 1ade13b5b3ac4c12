"""Configuration: one typed config and what turns it into a run.

``sections.py`` holds the config (its sections, every field with its help and rules);
``settings.py`` builds, checks and writes such sections (``trl_names.py``: TRL's and
verl's names for rlvr's settings); ``loading.py`` loads a config (``load_config``:
defaults, a YAML file, overrides); ``checks.py`` holds the rules between fields;
``presets.py`` the named algorithm presets and the defaults a language model takes;
``compose.py`` is the composition root that builds the task, the policy and the reward
runner a config asks for. A config is imported from here:
``from rlvr.config import Config, load_config``.
"""

from rlvr.base.errors import ConfigError
from rlvr.base.rules import BOUNDS, setting
from rlvr.config.checks import check_options
from rlvr.config.loading import config_from_dict, load_config, merge
from rlvr.config.sections import (
    DEFAULT_TORCH_THREADS,
    AlgoConfig,
    CausalLMOptions,
    ClusterConfig,
    Config,
    LogConfig,
    OptimConfig,
    PolicyConfig,
    RewardsConfig,
    SftConfig,
    TaskConfig,
)
from rlvr.config.settings import parse_overrides, read_mapping

__all__ = ["BOUNDS", "DEFAULT_TORCH_THREADS", "AlgoConfig", "CausalLMOptions", "ClusterConfig", "Config",
           "ConfigError", "LogConfig", "OptimConfig", "PolicyConfig", "RewardsConfig", "SftConfig",
           "TaskConfig", "check_options", "config_from_dict", "load_config", "merge", "parse_overrides",
           "read_mapping", "setting"]
