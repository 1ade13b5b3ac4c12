"""The rows of a data file, each with where it is, every problem a DataError naming that place.

JSON Lines (.jsonl), a JSON list of objects (.json), CSV (.csv, every value a string), Parquet (.parquet), or a
folder written by ``datasets``' ``save_to_disk``. A row's place is ``file:line`` (JSON Lines, CSV, a JSON syntax
error) or ``file: row i`` (1-based). A UTF-8 byte-order mark is skipped.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Any

from rlvr.base.data import MAX_LINE_BYTES, DataError, check_not_shadowed, parse_json, read_jsonl_lines

SUFFIXES = (".jsonl", ".json", ".csv", ".parquet")


def read_rows(path: str | Path, check: Any = None) -> list[tuple[str, dict[str, Any]]]:
    """(where, row) of every row, in order; ``check(row)`` raising ValueError becomes a DataError at ``where``.
    DataError for a missing path, an unknown suffix, bad syntax, a row that is not an object, no rows."""
    path = Path(path)
    if path.is_dir():
        rows = [(f"{path}: row {i + 1}", row) for i, row in enumerate(_read_saved_dataset(path))]
    elif not path.is_file():
        raise DataError(f"{path}: no such file or folder")
    elif path.suffix == ".jsonl":
        records = read_jsonl_lines(path, {}, check=check)  # checks each row where its line is known
        return [(f"{path}:{line}", row) for line, row in records]
    elif path.suffix == ".json":
        rows = _read_json(path)
    elif path.suffix == ".csv":
        rows = _read_csv(path)
    elif path.suffix == ".parquet":
        rows = [(f"{path}: row {i + 1}", row) for i, row in enumerate(_read_parquet(path))]
    else:
        raise DataError(f"{path}: unknown file type {path.suffix!r}; expected {', '.join(SUFFIXES)} "
                        "or a folder written by datasets' save_to_disk")
    if not rows:
        raise DataError(f"{path}: empty; expected at least one row")
    for where, row in rows:
        if check is not None:
            try:
                check(row)
            except ValueError as err:
                raise DataError(f"{where}: {err}") from err
    return rows


# what reading a damaged file or folder raises in pyarrow and datasets (ArrowInvalid, JSONDecodeError: ValueErrors)
_READ_ERRORS = (OSError, ValueError, KeyError, TypeError)


def _read_saved_dataset(path: Path) -> list[dict[str, Any]]:
    check_not_shadowed(["datasets", "pyarrow"])
    import datasets

    try:
        data = datasets.load_from_disk(str(path))
        if isinstance(data, datasets.DatasetDict):
            raise DataError(f"{path}: holds the splits {', '.join(data)}; give one split's folder, "
                            f"e.g. {path / 'train'}")
        return data.to_list()
    except FileNotFoundError as err:
        raise DataError(f"{path}: not a folder written by datasets' save_to_disk ({err})") from err
    except DataError:
        raise
    except _READ_ERRORS as err:
        raise DataError(f"{path}: a damaged datasets folder ({type(err).__name__}: {err})") from err


def _read_parquet(path: Path) -> list[dict[str, Any]]:
    check_not_shadowed(["pyarrow"])
    import pyarrow.parquet as pq

    try:
        return pq.read_table(path).to_pylist()
    except _READ_ERRORS as err:
        raise DataError(f"{path}: not a readable Parquet file ({type(err).__name__}: {err})") from err


def _decode(path: Path) -> str:
    """The text of ``path``, a UTF-8 byte-order mark dropped; DataError naming the line of a byte not UTF-8."""
    raw = path.read_bytes()
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        line = raw[:err.start].count(b"\n") + 1
        raise DataError(f"{path}:{line}: not valid UTF-8 ({err.reason} at byte {err.start})") from err


def _read_json(path: Path) -> list[tuple[str, dict[str, Any]]]:
    data = parse_json(_decode(path), str(path), whole_file=True)
    if not isinstance(data, list):
        raise DataError(f"{path}: expected a JSON list of objects, got {type(data).__name__}")
    for i, row in enumerate(data):
        if not isinstance(row, dict):
            raise DataError(f"{path}: row {i + 1}: expected a JSON object, got {type(row).__name__}")
    return [(f"{path}: row {i + 1}", row) for i, row in enumerate(data)]


def _read_csv(path: Path) -> list[tuple[str, dict[str, Any]]]:
    reader = csv.reader(io.StringIO(_decode(path), newline=""))
    rows: list[tuple[str, dict[str, Any]]] = []
    # a field may be as long as a JSON Lines line (csv's own limit, 128 KiB, is process-wide: restored after)
    previous = csv.field_size_limit(MAX_LINE_BYTES)
    try:
        header = next(reader, None)
        if header is not None:
            _check_header(header, path)
        for values in reader:
            where = f"{path}:{reader.line_num}"
            if len(values) > len(header):
                raise DataError(f"{where}: more values than the header's {len(header)} columns")
            if values:  # csv.DictReader skips blank lines too
                rows.append((where, dict(zip(header, values))))
    except csv.Error as err:
        raise DataError(f"{path}:{reader.line_num}: not valid CSV ({err})") from err
    finally:
        csv.field_size_limit(previous)
    return rows


def _check_header(header: list[str], path: Path) -> None:
    seen = set()
    for name in header:
        if name in seen:
            raise DataError(f"{path}:1: column {name!r} appears twice in the header; rename one")
        seen.add(name)
