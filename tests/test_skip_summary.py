"""The test suite's summary line for GSM8K tests skipped for want of the data (``conftest.pytest_terminal_summary``)."""

import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import conftest


def test_pytest_summary_says_when_gsm8k_data_is_missing(tmp_path):
    checkout = tmp_path / "checkout"
    (checkout / "tests").mkdir(parents=True)
    for name in ("conftest.py", "helpers.py"):
        shutil.copy(Path(__file__).with_name(name), checkout / "tests" / name)
    (checkout / "tests" / "test_gsm8k.py").write_text(
        "import pytest\n\n@pytest.mark.skip(reason='GSM8K data not found')\ndef test_gsm8k():\n    pass\n")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"], cwd=checkout,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    missing = tmp_path / "shared" / "data" / "gsm8k"
    assert f"GSM8K data not found at {missing}: 1 GSM8K test skipped" in proc.stdout


def test_gsm8k_summary_line_only_when_some_were_skipped(tmp_path, monkeypatch):
    monkeypatch.setattr(conftest, "GSM8K_DATA", tmp_path / "absent")
    lines = []
    reporter = SimpleNamespace(stats={"skipped": []}, write_line=lines.append)
    conftest.pytest_terminal_summary(reporter)
    assert lines == []
    reporter.stats["skipped"] = [SimpleNamespace(longrepr=("test_gsm8k.py", 3, "Skipped: no GSM8K data"))]
    conftest.pytest_terminal_summary(reporter)
    assert len(lines) == 1 and ": 1 GSM8K test skipped (put" in lines[0]
