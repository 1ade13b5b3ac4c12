"""JSON Lines loading that says exactly what is wrong and where.

Every error names ``file:line`` and what was expected there, so a bad row is found without a debugger.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import sys
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

from rlvr.base.errors import ConfigError


class DataError(ValueError):
    """A data file that cannot be used as it is; the message names file, line and problem."""


# The longest line read, in bytes without its newline: a GSM8K row is under 2 KB, and a line is read whole into
# memory (several times over, as JSON), so a runaway line stops here.
MAX_LINE_BYTES = 8 * 2**20
BOM = "\ufeff".encode()  # UTF-8's byte-order mark
HASH_BLOCK = 2**20  # bytes hashed at a time


def hash_file(path: Path, digest: Any = None) -> Any:
    """``digest`` (default: a new SHA-256) updated with the bytes of ``path``, read ``HASH_BLOCK`` at a time."""
    digest = hashlib.sha256() if digest is None else digest
    with Path(path).open("rb") as file:
        for block in iter(lambda: file.read(HASH_BLOCK), b""):
            digest.update(block)
    return digest


def read_jsonl(
    path: str | Path,
    required: dict[str, type],
    check: Callable[[dict[str, Any]], None] | None = None,
) -> list[dict[str, Any]]:
    """The records of a JSON Lines file (``read_jsonl_lines`` without the line numbers)."""
    return [record for _, record in read_jsonl_lines(path, required, check)]


def read_jsonl_lines(
    path: str | Path,
    required: dict[str, type],
    check: Callable[[dict[str, Any]], None] | None = None,
) -> list[tuple[int, dict[str, Any]]]:
    """(1-based line number, record) of each JSON object of a JSON Lines file; blank lines and a BOM are skipped.

    required: column name -> type each record must have; ``float`` also accepts JSON integers, ``int`` and
        ``float`` reject ``true``/``false``. check: per-record validation; its ValueError becomes a DataError.
    DataError on a missing or empty file, a line longer than ``MAX_LINE_BYTES``, not UTF-8 or JSON, or not an
    object, a missing column or a value of the wrong type.
    """
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: no such file")
    expected = ", ".join(f"{name}: {kind.__name__}" for name, kind in required.items())
    records = []
    with path.open("rb") as file:
        for line_number, raw in enumerate(_lines(file, MAX_LINE_BYTES), start=1):
            where = f"{path}:{line_number}"
            if raw is None:
                raise DataError(f"{where}: line longer than {MAX_LINE_BYTES} bytes (rlvr.base.data.MAX_LINE_BYTES)")
            if line_number == 1:
                raw = raw.removeprefix(BOM)  # written by some Windows editors; not part of the JSON
            record = _parse_line(raw, where)
            if record is None:
                continue
            _check_columns(record, required, where, expected)
            if check is not None:
                try:
                    check(record)
                except ValueError as exc:
                    raise DataError(f"{where}: {exc}") from exc
            records.append((line_number, record))
    if not records:
        wanted = f"JSON objects with {expected}" if required else "JSON objects, one per line"
        raise DataError(f"{path}: empty file; expected {wanted}")
    return records


def _lines(file: BinaryIO, limit: int) -> Iterator[bytes | None]:
    """The lines of ``file``; None for a line over ``limit`` bytes (of which at most ``limit + 1`` are read)."""
    while raw := file.readline(limit + 1):
        yield None if len(raw) > limit and not raw.endswith(b"\n") else raw


def parse_json(text: str, where: str, whole_file: bool = False) -> Any:
    """``text`` as JSON; DataError naming ``where`` (and, for a ``whole_file``, the line) when it is not."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        at = f"{where}:{exc.lineno}" if whole_file else where
        raise DataError(f"{at}: invalid JSON ({exc.msg} at column {exc.colno})") from exc
    except RecursionError as exc:  # the parser recurses once per nested array or object
        raise DataError(f"{where}: invalid JSON (nested too deeply)") from exc


def _parse_line(raw: bytes, where: str) -> dict[str, Any] | None:
    """One line's JSON object, or None for a blank line."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DataError(f"{where}: not valid UTF-8 ({exc.reason} at byte {exc.start})") from exc
    if not text.strip():
        return None
    record = parse_json(text, where)
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


# The third-party modules rlvr imports (some only for some tasks and policies).
DEPENDENCIES = ("yaml", "numpy", "torch", "tqdm", "matplotlib", "transformers", "tokenizers", "safetensors",
                "math_verify", "peft", "datasets", "pyarrow", "reasoning_gym", "ray")


def check_not_shadowed(names: Iterable[str] = DEPENDENCIES) -> None:
    """ConfigError when one of the modules ``names`` is (or would be) imported from a file in the working directory:
    a ``yaml.py`` there hides the installed package (``python -m``), and the later failures do not say why."""
    cwd = Path.cwd().resolve()
    for name in names:
        file = _module_file(name)
        if file is not None and (file.parent.parent if file.name == "__init__.py" else file.parent) == cwd:
            raise ConfigError(f"{file} in the working directory is imported as {name!r} in place of the installed "
                              f"package (Python looks in the working directory first); rename it")


def _module_file(name: str) -> Path | None:
    """Where module ``name`` was imported from, or would be (None: nowhere, or not a file)."""
    module = sys.modules.get(name)
    if module is not None:
        origin = getattr(module, "__file__", None)
    else:
        try:
            spec = importlib.util.find_spec(name)  # a top-level name: finds it without importing it
        except (ImportError, ValueError):
            return None
        origin = None if spec is None else spec.origin
    return Path(origin).resolve() if origin and origin not in ("built-in", "frozen") else None
