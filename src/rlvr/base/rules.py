"""The rules a setting declares, and the one check of a value against them.

A config field declares its default, help and rules in one line (``setting``); a task option declares the same rules
beside its task (``option``), its type being the annotation of the task's keyword argument. ``coerce`` checks a value's
type and ``check_rules`` its allowed values and bounds, for both.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import operator
import types
from pathlib import Path
from typing import Any, Union, get_args, get_origin

from rlvr.base.errors import ConfigError

# a bound rule -> (the test a value must pass, how messages and help write it)
BOUNDS = {"min": (operator.ge, ">="), "above": (operator.gt, ">"),
          "max": (operator.le, "<="), "below": (operator.lt, "<")}
SEED_MAX = 2**32 - 1  # numpy's seed range


def option(help: str, *, choices: Any = None, min: float | None = None, max: float | None = None,
           above: float | None = None, below: float | None = None) -> dict[str, Any]:
    """A task option's help and rules (those of ``setting``); its default and type are the task's keyword argument's."""
    rules = {"choices": choices, "min": min, "max": max, "above": above, "below": below}
    return {"help": help, **{key: rule for key, rule in rules.items() if rule is not None}}


def setting(default: Any, help: str, *, choices: Any = None, min: float | None = None, max: float | None = None,
            above: float | None = None, below: float | None = None, sections: dict[str, type] | None = None) -> Any:
    """A config field: its default, one line of help and its own rules, declared once.

    choices: the allowed values (a tuple, a registry whose keys are the names, or ``rlvr.config.settings.Names``); min,
    max: inclusive bounds; above, below: exclusive ones. An optional field's null passes every rule. sections: a nested
    section whose class the section's ``name`` picks (``policy.options``), ``default`` being the default name's.
    """
    metadata = option(help, choices=choices, min=min, max=max, above=above, below=below)
    if sections is not None:
        metadata["sections"] = sections
    if isinstance(default, (list, dict)):
        return dataclasses.field(default_factory=lambda: copy.deepcopy(default), metadata=metadata)
    if dataclasses.is_dataclass(default):  # a nested section
        return dataclasses.field(default_factory=type(default), metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def check_rules(path: str, value: Any, rules: dict[str, Any]) -> None:
    """ConfigError naming ``path`` when ``value`` is not one of its ``choices`` or breaks a bound."""
    choices = rules.get("choices")
    if choices is not None and value not in choices:
        raise ConfigError(f"{path}={value!r} is not allowed; choose one of: {', '.join(choices)}")
    for rule, (passes, word) in BOUNDS.items():
        if rule in rules and not passes(value, rules[rule]):
            raise ConfigError(f"{path}={value!r} must be {word} {rules[rule]}")


def rules_text(rules: dict[str, Any]) -> str:
    """Declared rules as help shows them: " [raw | centered]", " [> 0, < 1]"."""
    parts = [" | ".join(rules["choices"])] if "choices" in rules else []
    parts += [f"{word} {rules[rule]}" for rule, (_, word) in BOUNDS.items() if rule in rules]
    return f" [{', '.join(parts)}]" if parts else ""


def finite(value: Any) -> bool:
    """Is ``value`` a finite real number? NaN passes every range check (all comparisons are False) and no float setting
    means anything at infinity, so both are refused."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:  # an int past the float range
        return False


def coerce(path: str, value: Any, hint: Any) -> Any:
    """Check ``value`` against the annotation ``hint``; ints are accepted for floats, and text for a path. A union
    (``str | None``, ``str | Path``) takes what any arm takes."""
    origin, args = get_origin(hint), get_args(hint)
    if origin in (Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        arms = [a for a in args if a is not type(None)]
        for arm in arms[:-1]:
            try:
                return coerce(path, value, arm)
            except ConfigError:
                pass
        return coerce(path, value, arms[-1])
    base = origin or hint
    if base is float and isinstance(value, (int, float, str)) and not isinstance(value, bool):
        # YAML 1.1 reads "1e-3" (no dot) as a string; accept what float() accepts.
        try:
            number = float(value)
        except ValueError:
            number = None
        except OverflowError:  # an int past the float range
            raise ConfigError(f"{path}={value!r} must be a finite number") from None
        if number is not None:
            if not finite(number):
                raise ConfigError(f"{path}={number!r} must be a finite number")
            return number
    if base is bool and isinstance(value, bool):
        return value
    if base is int and isinstance(value, int) and not isinstance(value, bool):
        return value
    if base in (str, list, dict) and isinstance(value, base):
        return value
    if base is Any or (base is Path and isinstance(value, str)):
        return value
    name = getattr(base, "__name__", str(base))
    raise ConfigError(f"{path}: expected {name}, got {value!r} ({type(value).__name__})")
