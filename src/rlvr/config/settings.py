"""Typed settings: dataclass fields that declare their help and rules, YAML in and out.

A section is a dataclass whose fields are ``setting(...)`` (``rlvr.base.rules``); a field holding a dataclass is a
nested section. This module knows no section of rlvr's: it builds a section from a mapping (each value's type checked),
names every key that is no setting with the setting meant, checks every field's rules, writes the settings that apply as
YAML (plain, or with each field's help as a comment), reads YAML files and ``key=value`` overrides, merges mappings. The
schema is ``rlvr.config.sections``.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import fields
from pathlib import Path
from typing import Any, get_type_hints

import yaml

from rlvr.base.errors import ConfigError, did_you_mean
from rlvr.base.rules import check_rules, coerce, rules_text
from rlvr.config.trl_names import VERL_NAMES, foreign_hint


def section_type(cls: type, key: str, name: Any) -> type | None:
    """The section class of ``cls``'s field ``key``: its annotation when a dataclass, or for a field whose section
    depends on ``cls``'s ``name`` (``setting(sections=...)``) the one ``name`` picks; None: a value, or a name that
    picks none."""
    if picks_section(cls, key):
        return next(f for f in fields(cls) if f.name == key).metadata["sections"].get(name)
    hint = get_type_hints(cls).get(key)
    return hint if dataclasses.is_dataclass(hint) else None


def picks_section(cls: type, key: str) -> bool:
    """Is ``cls``'s field ``key`` a section whose class its ``name`` picks?"""
    return any(f.name == key and "sections" in f.metadata for f in fields(cls))


def _chosen(cls: type, node: Any) -> Any:
    """The ``name`` that the mapping ``node`` gives the section ``cls`` (its default when it gives none)."""
    given = node.get("name") if isinstance(node, dict) else None
    defaults = [f.default for f in fields(cls) if f.name == "name"]
    return given if given is not None else (defaults[0] if defaults else None)


# ---------------------------------------------------------------- checking


def check_fields(section: Any, prefix: str = "") -> None:
    """The rules each field declares (``setting``), over every section; a section its ``name`` picks
    (``setting(sections=...)``) is of the class picked."""
    for f in fields(section):
        value, path, rules = getattr(section, f.name), prefix + f.name, f.metadata
        if value is None:
            continue  # an optional field left null
        if "sections" in rules and not isinstance(value, picked := rules["sections"][section.name]):
            raise ConfigError(f"{path}: a {type(value).__name__}, and {prefix}name={section.name!r} takes a "
                              f"{picked.__name__}")
        if dataclasses.is_dataclass(value):
            check_fields(value, path + ".")
            continue
        check_rules(path, value, rules)


def build(cls: type, data: Any, prefix: str = "") -> Any:
    """A ``cls`` section from the mapping ``data``, each value checked against its field's type (every key must be a
    field: ``unknown_keys`` names the others first)."""
    if not isinstance(data, dict):
        raise ConfigError(f"{prefix.rstrip('.') or 'config'}: expected a mapping, got {data!r}")
    hints, chosen = get_type_hints(cls), _chosen(cls, data)
    kwargs = {}
    for key, value in data.items():
        path, section = f"{prefix}{key}", section_type(cls, key, chosen)
        if section is not None:
            kwargs[key] = build(section, {} if value is None else value, path + ".")
        elif not picks_section(cls, key):
            kwargs[key] = coerce(path, value, hints[key])
        # else: a name that picks no section; validation names it
    return cls(**kwargs)


# ---------------------------------------------------------------- unknown keys


def _section(path: str) -> str:
    """"algo." of "algo.epochs", "policy.options." of "policy.options.model", "" of "seed"."""
    return path[:path.rfind(".") + 1]


def is_option(path: str) -> bool:
    """Is ``path`` a key of a section named ``*options`` (a component's keyword arguments)?"""
    return _section(path).rstrip(".").endswith("options")


def _node(data: dict, path: str) -> Any:
    for part in path.split("."):
        data = data.get(part) if isinstance(data, dict) else None
    return data


def setting_paths(schema: type, data: dict) -> dict[str, str]:
    """Every setting's dotted path -> "" when it applies to the config mapping ``data``, else the choice it needs
    ("policy.name=causal_lm"): each section's fields, a section its ``name`` picks naming the choice."""
    paths: dict[str, str] = {}

    def walk(cls: type, node: Any, prefix: str, needs: str) -> None:
        chosen = _chosen(cls, node)
        for f in fields(cls):
            # a section the name picks: each choice's keys, those of another choice needing it
            picks = f.metadata.get("sections") or {chosen: section_type(cls, f.name, chosen)}
            for name, section in sorted(picks.items(), key=lambda item: item[0] == chosen):  # the chosen last
                if section is not None:
                    walk(section, _node(node, f.name), f"{prefix}{f.name}.",
                         needs or (f"{prefix}name={name}" if name != chosen else ""))
            if not any(picks.values()):
                paths[prefix + f.name] = needs

    walk(schema, data, "", "")
    return paths


def unknown_keys(schema: type, data: dict) -> list[tuple[str, str]]:
    """(path, hint) of every key of the config mapping ``data`` that names no setting, in every section. Keys of option
    sections come last."""
    found: list[tuple[str, Any, list[str]]] = []  # (path, value, the names allowed where it stands)

    def walk(cls: type, node: dict, prefix: str) -> None:
        names, chosen = [f.name for f in fields(cls)], _chosen(cls, node)
        for key, value in node.items():
            if key not in names:
                found.append((f"{prefix}{key}", value, names))
            elif (section := section_type(cls, key, chosen)) is not None and isinstance(value, dict):
                walk(section, value, f"{prefix}{key}.")

    walk(schema, data, "")
    if not found:
        return []
    paths = setting_paths(schema, data)
    found.sort(key=lambda item: is_option(item[0]))
    return [hint for path, value, allowed in found for hint in _unknown_key(path, value, allowed, paths)]


def _unknown_key(path: str, value: Any, allowed: list[str], paths: dict[str, str]) -> list[tuple[str, str]]:
    """(path, hint) for an unknown key; a mapping under it that holds verl's names (its ``actor_rollout_ref:`` section)
    gives one per setting in it."""
    if isinstance(value, dict) and value:
        leaves = _leaves(path, value)
        if any(leaf in VERL_NAMES for leaf, _ in leaves):
            return [(leaf, foreign_hint(leaf, v) if leaf in VERL_NAMES else "a verl setting rlvr has no equivalent "
                     "of (docs/how-to/from-trl.md lists those it has)") for leaf, v in leaves]
    key = path.rsplit(".", 1)[-1]
    if path in VERL_NAMES:
        return [(path, foreign_hint(path, value))]
    elsewhere = {p: when for p, when in paths.items() if _section(p) != _section(path)}
    prefix = "" if is_option(path) else path[: len(path) - len(key)]  # an option's message names its section
    return [(path, did_you_mean(key, allowed, elsewhere, known=foreign_hint(path, value), prefix=prefix))]


def _leaves(path: str, value: Any) -> list[tuple[str, Any]]:
    if not isinstance(value, dict) or not value:
        return [(path, value)]
    return [leaf for key, item in value.items() for leaf in _leaves(f"{path}.{key}", item)]


def unknown_message(unknown: list[tuple[str, str]]) -> str:
    """One line naming every unknown key, each with its hint."""
    def said(path: str, hint: str) -> str:
        if is_option(path):
            section, key = path.rsplit(".", 1)
            return f"{section}: unknown option {key!r}; {hint}"
        return f"unknown key {path!r}; {hint}"

    if len(unknown) == 1:
        return said(*unknown[0])
    return f"{len(unknown)} unknown keys: " + " ".join(f"({i}) {said(*item)}" for i, item in enumerate(unknown, 1))


# ---------------------------------------------------------------- YAML out


def named_callables(value: Any) -> Any:
    """``value`` with each callable (a reward function given from Python, ``rlvr.train``) written as its "module:name",
    so that YAML holds no Python object."""
    if callable(value):
        return f"{getattr(value, '__module__', '?')}:{getattr(value, '__qualname__', type(value).__name__)}"
    if isinstance(value, dict):
        return {key: named_callables(item) for key, item in value.items()}
    if isinstance(value, list):
        return [named_callables(item) for item in value]
    return value


def to_yaml(config: Any) -> str:
    """The settings as YAML."""
    return yaml.safe_dump(named_callables(dataclasses.asdict(config)), sort_keys=False)


def commented_yaml(section: Any, indent: str = "") -> list[str]:
    """The lines of YAML with each field's help and rules as a comment: every setting."""
    lines = []
    for f in fields(section):
        value = getattr(section, f.name)
        help_text = f.metadata.get("help", "") + rules_text(f.metadata)
        if dataclasses.is_dataclass(value):
            lines.append(f"{indent}{f.name}:" + (f"  # {help_text}" if help_text else ""))
            lines += commented_yaml(value, indent + "  ")
            continue
        text = yaml.safe_dump({f.name: named_callables(value)}, default_flow_style=True, width=10**6).strip()[1:-1]
        lines.append(f"{indent}{text}" + (f"  # {help_text}" if help_text else ""))
    return lines


# ---------------------------------------------------------------- YAML in


MAX_YAML_NODES = 100_000  # a document's values with its aliases expanded: an alias bomb stops here


@functools.cache
def _bounded_loader() -> type:
    """YAML's safe loader, refusing a document whose aliases expand past MAX_YAML_NODES values (nine aliases of nine,
    nine deep, are a billion values to whoever walks them). Made on first use: a ``yaml.py`` in the working directory is
    named before then."""

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
    """``text`` parsed as YAML; if it is not YAML, or its aliases expand past MAX_YAML_NODES values, a one-line
    ConfigError naming ``where``."""
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
    """The value of one override as YAML; one that is no YAML is a Jinja template (a chat template) taken as its text,
    or refused with how to quote it."""
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
    """``update`` over ``base``, mappings for the section ``cls``: sections merge key by key; a mapping field (keyword
    arguments: ``lora``) merges one level deep, its values replaced whole; anything else is replaced."""
    hints = get_type_hints(cls) if cls is not None else {}
    chosen = _chosen(cls, {**base, **update}) if cls is not None else None
    out = dict(base)
    for key, value in update.items():
        section = section_type(cls, key, chosen) if cls is not None else None
        if not (isinstance(value, dict) and isinstance(out.get(key), dict)):
            out[key] = value
        elif section is not None or key not in hints or picks_section(cls, key):
            out[key] = merge_into(section, out[key], value)
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
