"""Name -> function tables: the keys of each table are its allowed modes."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeVar

Fn = TypeVar("Fn")


def lookup(table: Mapping[str, Fn], name: str, kind: str) -> Fn:
    """``table[name]``, or a ValueError that names the ``kind`` and the allowed keys."""
    if name not in table:
        raise ValueError(f"unknown {kind} {name!r}; allowed: {', '.join(table)}")
    return table[name]
