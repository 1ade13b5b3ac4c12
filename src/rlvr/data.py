"""JSON Lines loading that says exactly what is wrong and where.

Every error names ``file:line`` and what was expected there, so a bad row in a
7,000-line data set is found without a debugger.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any


class DataError(ValueError):
    """A data file that cannot be used as it is; the message names file, line and problem."""


def read_jsonl(
    path: str | Path,
    required: dict[str, type],
    check: Callable[[dict[str, Any]], None] | None = None,
) -> list[dict[str, Any]]:
    """Read a JSON Lines file: one JSON object per line.

    required: column name -> type each record must have (``str``, ``int``, ``float``,
        ``bool``, ``list``, ``dict``). ``float`` also accepts JSON integers (JSON has one
        number type); ``int`` and ``float`` reject ``true``/``false``.
    check: optional per-record validation; a ``ValueError`` it raises becomes a
        ``DataError`` at that record's line.
    Returns the records (every column, not only the required ones), in file order.
    Blank lines are skipped. Raises ``DataError`` on a missing or empty file, a line
    that is not valid UTF-8 or JSON, a line that is not an object, a missing column or
    a value of the wrong type.
    """
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: no such file")
    expected = ", ".join(f"{name}: {kind.__name__}" for name, kind in required.items())
    records = []
    with path.open("rb") as file:
        for line_number, raw in enumerate(file, start=1):
            where = f"{path}:{line_number}"
            record = _parse_line(raw, where)
            if record is None:
                continue
            _check_columns(record, required, where, expected)
            if check is not None:
                try:
                    check(record)
                except ValueError as exc:
                    raise DataError(f"{where}: {exc}") from exc
            records.append(record)
    if not records:
        raise DataError(f"{path}: empty file; expected JSON objects with {expected}")
    return records


def _parse_line(raw: bytes, where: str) -> dict[str, Any] | None:
    """One line's JSON object, or None for a blank line."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DataError(f"{where}: not valid UTF-8 ({exc.reason} at byte {exc.start})") from exc
    if not text.strip():
        return None
    try:
        record = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DataError(f"{where}: invalid JSON ({exc.msg} at column {exc.colno})") from exc
    if not isinstance(record, dict):
        raise DataError(f"{where}: expected a JSON object, got {_json_type(record)}")
    return record


def _check_columns(record: dict[str, Any], required: dict[str, type], where: str, expected: str) -> None:
    for name, kind in required.items():
        if name not in record:
            found = ", ".join(record) or "no columns"
            raise DataError(f"{where}: missing column {name!r} (expected {expected}; found {found})")
        value = record[name]
        if not _has_type(value, kind):
            shown = "" if value is None else f" {value!r:.40}"
            raise DataError(
                f"{where}: column {name!r} should be {kind.__name__}, got {_json_type(value)}{shown}"
            )


def _has_type(value: Any, kind: type) -> bool:
    if kind in (int, float) and isinstance(value, bool):
        return False
    if kind is float:
        return isinstance(value, (int, float))
    return isinstance(value, kind)


def _json_type(value: Any) -> str:
    names = {dict: "object", list: "array", str: "string", bool: "boolean", int: "integer", float: "number"}
    return "null" if value is None else names.get(type(value), type(value).__name__)
