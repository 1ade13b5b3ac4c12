"""The README's Python example runs as written."""

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_python_example_runs():
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert blocks
    scope: dict = {}
    exec(blocks[0], scope)  # the project's own documentation, not model output
    records = scope["records"]
    assert [r for r in records if r["kind"] == "train"][-1]["step"] == 999
