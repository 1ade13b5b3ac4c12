"""rlvr.base.data.read_jsonl: records out, and file:line errors for every kind of bad input."""

from __future__ import annotations

import re

import pytest

from rlvr.base.data import DataError, read_jsonl

REQUIRED = {"question": str, "answer": str}


def write(tmp_path, text: str | bytes, name: str = "data.jsonl"):
    path = tmp_path / name
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return path


def test_reads_records_with_all_columns_and_skips_blank_lines(tmp_path):
    path = write(tmp_path, '{"question": "q1", "answer": "a1", "id": 1}\n\n{"question": "q2", "answer": "a2"}\n\n')
    assert read_jsonl(path, REQUIRED) == [
        {"question": "q1", "answer": "a1", "id": 1},
        {"question": "q2", "answer": "a2"},
    ]


def test_float_column_takes_json_integers_but_int_rejects_booleans(tmp_path):
    path = write(tmp_path, '{"x": 1, "y": 2.5}\n')
    assert read_jsonl(path, {"x": float, "y": float}) == [{"x": 1, "y": 2.5}]
    path = write(tmp_path, '{"n": 3}\n{"n": true}\n')
    with pytest.raises(DataError, match=re.escape(f"{path}:2: column 'n' should be int, got boolean True")):
        read_jsonl(path, {"n": int})


@pytest.mark.parametrize(
    "lines, line_number, message",
    [
        (['{"question": "q", "answer": "a"}', '{"question": "q", "answer": }'], 2,
         "invalid JSON (Expecting value at column 29)"),
        (['{"question": "q", "answer": "a"}'] * 2 + ['{"question": "q"}'], 3,
         "missing column 'answer' (expected question: str, answer: str; found question)"),
        (['{"question": "q", "answer": 5}'], 1, "column 'answer' should be str, got integer 5"),
        (['["q", "a"]'], 1, "expected a JSON object, got array"),
        (['{"question": "q", "answer": null}'], 1, "column 'answer' should be str, got null"),
    ],
)
def test_bad_lines_name_file_line_and_problem(tmp_path, lines, line_number, message):
    path = write(tmp_path, "\n".join(lines) + "\n")
    with pytest.raises(DataError, match=re.escape(f"{path}:{line_number}: {message}")):
        read_jsonl(path, REQUIRED)


def test_not_utf8_names_the_line(tmp_path):
    path = write(tmp_path, b'{"question": "q", "answer": "a"}\n{"question": "\xff", "answer": "a"}\n')
    with pytest.raises(DataError, match=re.escape(f"{path}:2: not valid UTF-8")):
        read_jsonl(path, REQUIRED)


@pytest.mark.parametrize("text", ["", "\n  \n"])
def test_empty_file(tmp_path, text):
    path = write(tmp_path, text)
    with pytest.raises(DataError, match=re.escape(f"{path}: empty file; expected JSON objects with question: str")):
        read_jsonl(path, REQUIRED)


def test_missing_file(tmp_path):
    with pytest.raises(DataError, match="nope.jsonl: no such file"):
        read_jsonl(tmp_path / "nope.jsonl", REQUIRED)


def test_check_errors_get_the_line(tmp_path):
    path = write(tmp_path, '{"question": "q", "answer": "#### 1"}\n{"question": "q", "answer": "none"}\n')

    def check(record):
        if "####" not in record["answer"]:
            raise ValueError("no final answer")

    with pytest.raises(DataError, match=re.escape(f"{path}:2: no final answer")):
        read_jsonl(path, REQUIRED, check=check)


def test_line_over_the_size_limit_names_file_line_and_limit(tmp_path, monkeypatch):
    """Limit 64 bytes (the real one is MiBs): a 64-byte line passes, 65 bytes do not,
    and reading stops there instead of holding the whole line."""
    import rlvr.base.data

    monkeypatch.setattr(rlvr.base.data, "MAX_LINE_BYTES", 64)
    fits = '{"question": "q", "answer": "' + "a" * 33 + '"}'  # 64 bytes
    assert len(fits) == 64 and len(read_jsonl(write(tmp_path, fits + "\n" + fits), REQUIRED)) == 2
    path = write(tmp_path, f'{fits}\n\n{fits[:-2]}a"}}\n')
    message = f"{path}:3: line longer than 64 bytes (rlvr.base.data.MAX_LINE_BYTES)"
    with pytest.raises(DataError, match=re.escape(message)):
        read_jsonl(path, REQUIRED)


def test_deeply_nested_json_is_a_data_error(tmp_path):
    path = write(tmp_path, '{"question": "q", "answer": "a"}\n' + "[" * 100_000 + "\n")
    with pytest.raises(DataError, match=re.escape(f"{path}:2: invalid JSON (nested too deeply)")):
        read_jsonl(path, REQUIRED)
