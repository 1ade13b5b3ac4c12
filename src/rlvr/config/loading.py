"""A ``Config`` from a YAML file and ``key=value`` overrides: the defaults, then the file, then the overrides, merged
(``merge``), checked for unknown keys, built and validated (``config_from_dict``), before any work is done."""

from __future__ import annotations

import warnings
from pathlib import Path

from rlvr.base.errors import ConfigError
from rlvr.config.checks import validate
from rlvr.config.presets import resolve_defaults
from rlvr.config.sections import Config
from rlvr.config.settings import (
    build,
    merge_into,
    parse_overrides,
    read_mapping,
    unknown_keys,
    unknown_message,
)

# the settings of the sorting task and of the positional policy, read from where they were before their options held
# them (a run directory written then resumes as it was): section -> (the name they are for, the keys)
MOVED_INTO_OPTIONS = {"task": ("sorting", ("reward", "num_numbers", "vocab_size", "prompts", "allow_repeats",
                                           "eval_size")),
                      "policy": ("positional", ("embedding_dim", "embedding_std"))}


def moved_into_options(data: dict) -> dict:
    """``data`` (a config mapping) with each key of MOVED_INTO_OPTIONS under its section's ``options``; one given in
    both places is a ConfigError, one for another name is ignored, with a warning."""
    out = dict(data)
    for section, (owner, keys) in MOVED_INTO_OPTIONS.items():
        node = out.get(section)
        if not isinstance(node, dict) or not any(key in node for key in keys):
            continue
        node, options = dict(node), node.get("options") or {}
        name = node.get("name") or owner
        if not isinstance(options, dict):
            continue  # the builder names it
        options = dict(options)
        for key in (key for key in keys if key in node):
            value = node.pop(key)
            if name != owner:
                warnings.warn(f"{section}.{key}={value!r} is ignored: it is for {section}.name={owner!r} only, "
                              f"not {name!r}", stacklevel=3)
            elif key in options:
                raise ConfigError(f"{section}.{key} is {section}.options.{key}: give it once")
            else:
                options[key] = value
        out[section] = {**node, "options": options}
    return out


def merge(base: dict, update: dict) -> dict:
    """Config mappings merged, ``update`` winning: sections key by key, mappings (``policy.options.lora``) one level
    deep (``rlvr.config.settings.merge_into``); a key of MOVED_INTO_OPTIONS in ``update`` wins over ``base``'s in the
    section's options, and the reverse."""
    merged = merge_into(Config, base, update)
    for section, (_, keys) in MOVED_INTO_OPTIONS.items():
        new, given = merged.get(section), update.get(section)
        if not (isinstance(new, dict) and isinstance(given, dict)):
            continue
        new = merged[section] = dict(new)  # the caller's mappings stay as they are
        for key in keys:
            if key in given and isinstance(new.get("options"), dict) and key in new["options"]:
                new["options"] = {k: v for k, v in new["options"].items() if k != key}
            elif key in (given.get("options") if isinstance(given.get("options"), dict) else {}):
                new.pop(key, None)
    return merged


def config_from_dict(data: dict) -> Config:
    """A validated Config from a nested mapping (missing keys take the defaults, after ``algo.preset`` and the causal-LM
    defaults: ``rlvr.config.presets.resolve_defaults``)."""
    data = resolve_defaults(moved_into_options(data) if isinstance(data, dict) else data or {})
    if isinstance(data, dict) and (unknown := unknown_keys(Config, data)):
        raise ConfigError(unknown_message(unknown))
    config = build(Config, data)
    validate(config)
    return config


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> Config:
    """Defaults <- YAML file <- ``key=value`` overrides, then validation."""
    data = {} if path is None else read_mapping(path)
    if overrides:
        data = merge(data, parse_overrides(overrides))
    return config_from_dict(data)
