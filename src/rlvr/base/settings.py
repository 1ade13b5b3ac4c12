"""Typed settings: dataclass fields that declare their help and rules, YAML in and out.

A section is a dataclass whose fields are ``setting(...)``: a default, one line of help
and the field's own rules (``rlvr.base.rules``); a field whose type is a dataclass is a
nested section. This module knows no section of rlvr's: it builds a section from a
mapping (each value's type checked), checks every field's rules, writes the settings
that apply as YAML (plain, or with each field's help as a comment), reads YAML files
and ``key=value`` overrides, merges mappings. Every key that is no setting is named, with the setting meant, by
``rlvr.base.unknown_keys``. The schema is ``rlvr.config``; the rules between fields are
``rlvr.config.checks``.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import importlib
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import field, fields
from pathlib import Path
from typing import Any, get_type_hints

import yaml

from rlvr.base.errors import ConfigError
from rlvr.base.rules import check_rules, coerce, option, rules_text

# a free-form mapping field's dotted path -> a function giving {owner's name: its option names}
OptionOwners = Mapping[str, Callable[[], Mapping[str, tuple[str, ...]]]]


class Names:
    """The names of a registry (``module.attribute``, a mapping or a tuple), imported when
    first asked for: a field's ``choices`` that does not import what it names."""

    def __init__(self, module: str, attribute: str):
        self.module, self.attribute = module, attribute

    def names(self) -> tuple[str, ...]:
        return tuple(getattr(importlib.import_module(self.module), self.attribute))

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __contains__(self, name: object) -> bool:
        return name in self.names()

    def __len__(self) -> int:
        return len(self.names())


def setting(default: Any, help: str, *, choices: Any = None, min: float | None = None, max: float | None = None,
            above: float | None = None, below: float | None = None, only: str | None = None,
            factory: Callable[[], Any] | None = None) -> Any:
    """A config field: its default, one line of help and its own rules, declared once.

    choices: the allowed values (a tuple, a registry whose keys are the names, or
    ``Names``); min, max: inclusive bounds; above, below: exclusive ones; only: the rules
    hold only when the section's ``name`` is this. An optional field's null passes every
    rule. factory: makes the default when a section is made (``default`` is then unused).
    """
    metadata = option(help, choices=choices, min=min, max=max, above=above, below=below)
    if only is not None:
        metadata["only"] = only
    if factory is not None:
        return field(default_factory=factory, metadata=metadata)
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: copy.deepcopy(default), metadata=metadata)
    if dataclasses.is_dataclass(default):  # a nested section
        return field(default_factory=type(default), metadata=metadata)
    return field(default=default, metadata=metadata)


# ---------------------------------------------------------------- checking


def applies(section: Any, f: dataclasses.Field) -> bool:
    """Does ``f`` apply to ``section``'s choice (its ``only`` rule, if any, names the section's ``name``)?"""
    return f.metadata.get("only", getattr(section, "name", None)) == getattr(section, "name", None)


def unused_fields(config: Any) -> dict[str, list[str]]:
    """Section -> the fields of ``config``'s sections that are for another choice (``only``)."""
    return {f.name: [g.name for g in fields(section) if not applies(section, g)]
            for f in fields(config) if dataclasses.is_dataclass(section := getattr(config, f.name))}


def check_fields(section: Any, prefix: str = "") -> None:
    """The rules each field declares (``setting``), over every section; a field of another
    choice given a value is ignored, with a warning."""
    name = getattr(section, "name", None)  # the task's or policy's name, for messages
    for f in fields(section):
        value, path, rules = getattr(section, f.name), prefix + f.name, f.metadata
        if value is None:
            continue  # an optional field left null
        if not applies(section, f):  # a field of another task or policy: unused here
            if value != getattr(type(section)(), f.name):
                shown = dataclasses.asdict(value) if dataclasses.is_dataclass(value) else value
                warnings.warn(f"{path}={shown!r} is ignored: it is for {prefix}name={rules['only']!r} only, "
                              f"not {name!r}", stacklevel=3)
            continue
        if dataclasses.is_dataclass(value):
            check_fields(value, path + ".")
            continue
        check_rules(path, value, rules)


def build(cls: type, data: Any, prefix: str = "") -> Any:
    """A ``cls`` section from the mapping ``data``, each value checked against its field's
    type (every key must be a field: ``unknown_keys`` names the others first)."""
    if not isinstance(data, dict):
        raise ConfigError(f"{prefix.rstrip('.') or 'config'}: expected a mapping, got {data!r}")
    hints = get_type_hints(cls)
    kwargs = {}
    for key, value in data.items():
        path, hint = f"{prefix}{key}", hints[key]
        if dataclasses.is_dataclass(hint):
            kwargs[key] = build(hint, {} if value is None else value, path + ".")
        else:
            kwargs[key] = coerce(path, value, hint)
    return cls(**kwargs)


# ---------------------------------------------------------------- YAML out


def named_callables(value: Any) -> Any:
    """``value`` with each callable (a reward function given from Python, ``rlvr.train``)
    written as its "module:name", so that YAML holds no Python object."""
    if callable(value):
        return f"{getattr(value, '__module__', '?')}:{getattr(value, '__qualname__', type(value).__name__)}"
    if isinstance(value, dict):
        return {key: named_callables(item) for key, item in value.items()}
    if isinstance(value, list):
        return [named_callables(item) for item in value]
    return value


def to_yaml(config: Any) -> str:
    """The settings that apply as YAML (a field of another choice left out: loaded back,
    it takes its default, as the config built from it has)."""
    data = dataclasses.asdict(config)
    for section, unused in unused_fields(config).items():
        for name in unused:
            del data[section][name]
    return yaml.safe_dump(named_callables(data), sort_keys=False)


# a free-form mapping's own entries, for help: (key, value given or its default, its rules as metadata)
MappingEntries = Callable[[Any, Any], list[tuple[str, Any, dict[str, Any]]]]


def commented_yaml(section: Any, indent: str = "", entries: dict[str, MappingEntries] | None = None,
                   prefix: str = "") -> list[str]:
    """The lines of YAML with each field's help and rules as a comment: every setting that
    applies. ``entries``: for a free-form mapping's dotted path (``task.options``), the
    keys it takes, each shown with its value (given, else its default) and its own help."""
    lines = []
    for f in fields(section):
        if not applies(section, f):
            continue
        value = getattr(section, f.name)
        help_text = f.metadata.get("help", "") + rules_text(f.metadata)
        if dataclasses.is_dataclass(value):
            lines.append(f"{indent}{f.name}:" + (f"  # {help_text}" if help_text else ""))
            lines += commented_yaml(value, indent + "  ", entries, f"{prefix}{f.name}.")
            continue
        expand = (entries or {}).get(f"{prefix}{f.name}")
        listed = expand(section, value) if expand is not None and isinstance(value, dict) else []
        if listed:
            lines.append(f"{indent}{f.name}:" + (f"  # {help_text}" if help_text else ""))
            for key, item, rules in listed:
                text = yaml.safe_dump({key: named_callables(item)}, default_flow_style=True, width=10**6).strip()
                note = rules.get("help", "") + rules_text(rules)
                lines.append(f"{indent}  {text[1:-1]}" + (f"  # {note}" if note else ""))
            continue
        text = yaml.safe_dump({f.name: named_callables(value)}, default_flow_style=True, width=10**6).strip()[1:-1]
        lines.append(f"{indent}{text}" + (f"  # {help_text}" if help_text else ""))
    return lines


# ---------------------------------------------------------------- YAML in


MAX_YAML_NODES = 100_000  # a document's values with its aliases expanded: an alias bomb stops here


@functools.cache
def _bounded_loader() -> type:
    """YAML's safe loader, refusing a document whose aliases expand past MAX_YAML_NODES
    values (nine aliases of nine, nine deep, are a billion values to whoever walks them).
    Made on first use: a ``yaml.py`` in the working directory is named before then."""

    class BoundedLoader(yaml.SafeLoader):
        def construct_document(self, node: yaml.Node) -> Any:
            sizes: dict[int, int] = {}

            def size(n: yaml.Node) -> int:  # each distinct node sized once: linear in the document's text
                if id(n) not in sizes:
                    sizes[id(n)] = 1  # a node inside itself (a recursive alias) counts once
                    children = (n.value if isinstance(n, yaml.SequenceNode) else
                                [part for pair in n.value for part in pair] if isinstance(n, yaml.MappingNode)
                                else [])
                    sizes[id(n)] = min(1 + sum(size(child) for child in children), MAX_YAML_NODES + 1)
                return sizes[id(n)]

            if size(node) > MAX_YAML_NODES:
                raise yaml.YAMLError(f"its aliases expand to more than {MAX_YAML_NODES} values")
            return super().construct_document(node)

    return BoundedLoader


def load_yaml(text: str, where: str) -> Any:
    """``text`` parsed as YAML; if it is not YAML, or its aliases expand past
    MAX_YAML_NODES values, a one-line ConfigError naming ``where``."""
    try:
        return yaml.load(text, Loader=_bounded_loader())  # noqa: S506 (a safe loader)
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ConfigError(f"{where}: not valid YAML ({err.problem or err.context}{at})") from err
    except yaml.YAMLError as err:
        raise ConfigError(f"{where}: not valid YAML ({' '.join(str(err).split())})") from err
    except RecursionError as err:  # the parser recurses once per level of nesting
        raise ConfigError(f"{where}: not valid YAML (nested too deeply)") from err


def parse_overrides(overrides: list[str]) -> dict:
    """``["algo.lr=1e-2", "task.prompts=null"]`` -> nested dict, values parsed as YAML."""
    data: dict = {}
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} is not key=value (e.g. algo.group_size=16)")
        key, raw = item.split("=", 1)
        value = _override_value(raw, item)
        node = data
        parts = key.strip().split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override {item!r}: {part!r} is not a section")
        node[parts[-1]] = value
    return data


JINJA_MARKS = ("{%", "{{", "{#")  # a chat template's tags: its text is no YAML, it is the value


def _override_value(raw: str, item: str) -> Any:
    """The value of one override as YAML; one that is no YAML is a Jinja template (a chat
    template) taken as its text, or refused with how to quote it."""
    if not raw.strip():
        return ""
    try:
        return load_yaml(raw, f"override {item!r}")
    except ConfigError as err:
        if any(mark in raw for mark in JINJA_MARKS):
            return raw
        key = item.split("=", 1)[0]
        raise ConfigError(f"{err}; to give it as text, quote it: {key}='\"...\"' (or set it in a YAML "
                          "file)") from err


def merge_into(cls: type | None, base: dict, update: dict) -> dict:
    """``update`` over ``base``, mappings for the section ``cls``: sections merge key by key;
    a free-form mapping field (keyword arguments: ``lora``, ``task.options``) merges one
    level deep, its values replaced whole; anything else is replaced."""
    hints = get_type_hints(cls) if cls is not None else {}
    out = dict(base)
    for key, value in update.items():
        hint = hints.get(key)
        if not (isinstance(value, dict) and isinstance(out.get(key), dict)):
            out[key] = value
        elif hint is None or dataclasses.is_dataclass(hint):
            out[key] = merge_into(hint, out[key], value)
        else:
            out[key] = {**out[key], **value}
    return out


def read_mapping(path: str | Path) -> dict:
    """The mapping a YAML config file holds, not yet built or validated."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as err:
        raise ConfigError(f"{path}: not valid UTF-8 ({err.reason} at byte {err.start})") from err
    data = load_yaml(text, str(path)) or {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level")
    return data
