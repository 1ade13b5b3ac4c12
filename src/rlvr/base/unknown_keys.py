"""Every key of a config mapping that is no setting, named with the setting meant: a
misspelling's nearest setting, a setting that needs another choice ("policy.name=causal_lm"),
TRL's and verl's names for rlvr's (``rlvr.base.trl_names``), and a component's unknown
option beside the options it takes."""

from __future__ import annotations

import dataclasses
from dataclasses import fields
from typing import Any, get_type_hints

from rlvr.base.errors import did_you_mean
from rlvr.base.settings import OptionOwners
from rlvr.base.trl_names import VERL_NAMES, foreign_hint


def _section(path: str) -> str:
    """"algo." of "algo.epochs", "policy.options." of "policy.options.model", "" of "seed"."""
    return path[:path.rfind(".") + 1]


def is_option(path: str) -> bool:
    """Is ``path`` a key of a section named ``*options`` (a component's keyword arguments)?"""
    return _section(path).rstrip(".").endswith("options")


def _chosen(cls: type, node: Any) -> Any:
    """The ``name`` that the mapping ``node`` gives the section ``cls`` (its default when it gives none)."""
    given = node.get("name") if isinstance(node, dict) else None
    defaults = [f.default for f in fields(cls) if f.name == "name"]
    return given if given is not None else (defaults[0] if defaults else None)


def _node(data: dict, path: str) -> Any:
    for part in path.split("."):
        data = data.get(part) if isinstance(data, dict) else None
    return data


def setting_paths(schema: type, data: dict, owners: OptionOwners) -> dict[str, str]:
    """Every setting's dotted path -> "" when it applies to the config mapping ``data``,
    else the choice it needs ("policy.name=causal_lm"): each section's fields (``only``
    names the choice), and the keys ``owners`` gives each free-form mapping field."""
    paths: dict[str, str] = {}

    def walk(cls: type, node: Any, prefix: str, needs: str) -> None:
        hints, chosen = get_type_hints(cls), _chosen(cls, node)
        for f in fields(cls):
            only = f.metadata.get("only")
            when = needs or (f"{prefix}name={only}" if only is not None and only != chosen else "")
            if dataclasses.is_dataclass(hints[f.name]):
                walk(hints[f.name], _node(node, f.name), f"{prefix}{f.name}.", when)
            else:
                paths[prefix + f.name] = when

    walk(schema, data, "", "")
    for field_path, owners_of in owners.items():
        section = field_path.rsplit(".", 1)[0]
        chosen = _chosen(get_type_hints(schema)[section], data.get(section))
        names_of: dict[str, list[str]] = {}
        for name, keys in owners_of().items():
            for key in keys:
                names_of.setdefault(key, []).append(name)
        for key, names in names_of.items():
            either = " or ".join([", ".join(names[:-1]), names[-1]] if len(names) > 1 else names)
            paths[f"{field_path}.{key}"] = "" if chosen in names else f"{section}.name={either}"
    return paths


def unknown_keys(schema: type, data: dict, owners: OptionOwners, free: bool = True) -> list[tuple[str, str]]:
    """(path, hint) of every key of the config mapping ``data`` that names no setting: in
    every section, and (``free``) in the free-form mappings of ``owners`` for the chosen
    owner (one that takes none is not read). Keys of option sections come last."""
    found: list[tuple[str, Any, list[str]]] = []  # (path, value, the names allowed where it stands)

    def walk(cls: type, node: dict, prefix: str) -> None:
        hints, names = get_type_hints(cls), [f.name for f in fields(cls)]
        for key, value in node.items():
            if key not in names:
                found.append((f"{prefix}{key}", value, names))
            elif dataclasses.is_dataclass(hints[key]) and isinstance(value, dict):
                walk(hints[key], value, f"{prefix}{key}.")

    walk(schema, data, "")
    if not found and not free:
        return []  # no hint to look for: the owners' options are not imported
    paths = setting_paths(schema, data, owners)
    for field_path in owners if free else ():
        node = _node(data, field_path)
        allowed = [p.rsplit(".", 1)[1] for p, when in paths.items() if _section(p) == f"{field_path}." and not when]
        if isinstance(node, dict) and allowed:
            found += [(f"{field_path}.{key}", value, allowed) for key, value in node.items() if key not in allowed]
    found.sort(key=lambda item: is_option(item[0]))
    return [hint for path, value, allowed in found for hint in _unknown_key(path, value, allowed, paths)]


def _unknown_key(path: str, value: Any, allowed: list[str], paths: dict[str, str]) -> list[tuple[str, str]]:
    """(path, hint) for an unknown key; a mapping under it that holds verl's names (its
    ``actor_rollout_ref:`` section) gives one per setting in it."""
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
