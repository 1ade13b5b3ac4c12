"""A ``Config`` from a YAML file and ``key=value`` overrides: the defaults, then the file, then
the overrides, merged (``merge``), checked for unknown keys, built and validated
(``config_from_dict``), before any work is done."""

from __future__ import annotations

from pathlib import Path

from rlvr.base.errors import ConfigError
from rlvr.base.settings import build, merge_into, parse_overrides, read_mapping, unused_fields
from rlvr.base.unknown_keys import unknown_keys, unknown_message
from rlvr.config.checks import OPTION_OWNERS, validate
from rlvr.config.presets import resolve_defaults
from rlvr.config.sections import Config


def merge(base: dict, update: dict) -> dict:
    """Config mappings merged, ``update`` winning: sections key by key, free-form mappings
    (``task.options``, ``policy.options.lora``) one level deep (``rlvr.base.settings.merge_into``)."""
    return merge_into(Config, base, update)


def config_from_dict(data: dict) -> Config:
    """A validated Config from a nested mapping (missing keys take the defaults, after
    ``algo.preset`` and the causal-LM defaults: ``rlvr.config.presets.resolve_defaults``).
    Unknown keys of ``task.options`` alone are left to ``check_options``."""
    data = resolve_defaults(data or {})
    if isinstance(data, dict) and unknown_keys(Config, data, OPTION_OWNERS, free=False):
        raise ConfigError(unknown_message(unknown_keys(Config, data, OPTION_OWNERS)))
    config = build(Config, data)
    validate(config)
    for section, unused in unused_fields(config).items():
        # ignored (validate warned when given): the default, as a config written and read back has
        defaults = type(getattr(config, section))()
        for name in unused:
            setattr(getattr(config, section), name, getattr(defaults, name))
    return config


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> Config:
    """Defaults <- YAML file <- ``key=value`` overrides, then validation."""
    data = {} if path is None else read_mapping(path)
    if overrides:
        data = merge(data, parse_overrides(overrides))
    return config_from_dict(data)
