"""The docs' reference pages, made from the code (never copied): every config key with its
type, default, rules and help (``config_markdown``), each task's options, the command line
from its parsers (``cli_markdown``), and TRL's and verl's names (``rlvr.config.trl_names``).
The docs site's hook (``hooks.py`` beside this file) puts each where its page says."""

from __future__ import annotations

import argparse
import dataclasses
import html
import typing
from typing import Any

from rlvr.config import Config


def config_markdown() -> str:
    """Every config key: one table per section, then each task's options."""
    parts = ["Every key of a run's config, as `rlvr config` checks it: its type, its default, "
             "its rules (an optional key's null passes them) and its help. A section marked with a "
             "`name` is the one that choice takes.\n"]
    top = [f for f in dataclasses.fields(Config) if not dataclasses.is_dataclass(_hint(Config, f))]
    parts.append(_table("Top level", "", top, Config))
    for f in dataclasses.fields(Config):
        section = _hint(Config, f)
        if dataclasses.is_dataclass(section):
            parts.extend(_sections(f.name, section))
    parts.append(_task_options())
    return "\n".join(parts)


def _sections(path: str, cls: type, when: str = "") -> list[str]:
    leaves = [f for f in dataclasses.fields(cls)
              if not dataclasses.is_dataclass(_hint(cls, f)) and "sections" not in f.metadata]
    parts = [_table(f"`{path}`{when}", f"{path}.", leaves, cls)] if leaves else []
    for f in dataclasses.fields(cls):
        inner = _hint(cls, f)
        if dataclasses.is_dataclass(inner):
            parts.extend(_sections(f"{path}.{f.name}", inner, when))
        for name, section in f.metadata.get("sections", {}).items() if path != "task" else ():  # by task below
            parts.extend(_sections(f"{path}.{f.name}", section, f" (`{path}.name: {name}`)"))
    return parts


def _table(title: str, prefix: str, fields: list[dataclasses.Field], cls: type) -> str:
    rows = [f"## {title}\n", "| key | type | default | rules | help |", "| --- | --- | --- | --- | --- |"]
    for f in fields:
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        rows.append(f"| `{prefix}{f.name}` | {_cell(_type_name(_hint(cls, f)))} | {_cell(_value(default))} | "
                    f"{_cell(_rules(f.metadata))} | {_cell(f.metadata.get('help', ''))} |")
    return "\n".join(rows) + "\n"


def _task_options() -> str:
    from rlvr.tasks import TASK_OPTIONS

    parts = ["## `task.options`, by task\n", "Each task's keyword arguments.\n"]
    for name, section in TASK_OPTIONS.items():
        rows = [f"### `task.name: {name}`\n", "| option | default | rules | help |", "| --- | --- | --- | --- |"]
        for f in dataclasses.fields(section):
            shown = "*required*" if f.metadata.get("required") else _value(f.default_factory())
            rows.append(f"| `{f.name}` | {_cell(shown)} | {_cell(_rules(f.metadata))} | "
                        f"{_cell(f.metadata.get('help', ''))} |")
        parts.append("\n".join(rows) + "\n")
    return "\n".join(parts)


def cli_markdown() -> str:
    """Each ``rlvr`` command: its description and its arguments, from the parsers."""
    from rlvr.cli import build_parser

    parser = build_parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    parts = []
    for name, command in sub.choices.items():
        parts.append(f"## `rlvr {name}`\n\n{command.description or ''}\n")
        rows = [f"- `{_flags(action)}`: {action.help or ''}"
                for action in command._actions if not isinstance(action, argparse._HelpAction)]
        parts.append("\n".join(rows) + "\n")
        if command.epilog:
            parts.append(f"```\n{command.epilog.strip()}\n```\n")
    return "\n".join(parts)


def trl_names_markdown() -> str:
    """TRL's and verl's names for rlvr's settings, the tables ``rlvr.config.trl_names`` holds."""
    from rlvr.config.trl_names import markdown_table

    return "\n".join(f"## {framework}\n\n{markdown_table(framework)}\n" for framework in ("TRL", "verl"))


def _flags(action: argparse.Action) -> str:
    if not action.option_strings:
        return action.metavar or action.dest
    metavar = "" if action.nargs == 0 else f" {action.metavar or action.dest.upper()}"
    return ", ".join(action.option_strings) + metavar


def _hint(cls: type, f: dataclasses.Field) -> Any:
    return typing.get_type_hints(cls)[f.name]


def _type_name(hint: Any) -> str:
    if isinstance(hint, type):
        return hint.__name__
    return str(hint).replace("typing.", "")


def _value(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    return f"`{value!r}`" if isinstance(value, str) else f"`{value}`"


def _rules(metadata: Any) -> str:
    rules = []
    choices = metadata.get("choices")
    if choices is not None:
        names = list(choices.keys()) if hasattr(choices, "keys") else list(choices)
        rules.append("one of " + ", ".join(f"`{c}`" for c in names))
    for key, sign in (("min", ">="), ("max", "<="), ("above", ">"), ("below", "<")):
        if metadata.get(key) is not None:
            bound = metadata[key]
            rules.append(f"{sign} {int(bound) if float(bound).is_integer() else bound}")
    return "; ".join(rules)


def _cell(text: str) -> str:
    """``text`` as one table cell: HTML's special characters escaped (``runs/<name>`` is text,
    not a tag), the column bar escaped, on one line."""
    return html.escape(str(text), quote=False).replace("|", "\\|").replace("\n", " ")
