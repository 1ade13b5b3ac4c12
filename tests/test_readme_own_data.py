"""The "your own data" quick start (docs/tutorials/getting-started.md, and the README's tour) runs as
written, and shows the example file as it is."""

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def own_data_block() -> tuple[str, str]:
    """The YAML and the command of the "Train on your own data" block (docs/tutorials/getting-started.md)."""
    text = (ROOT / "docs" / "tutorials" / "getting-started.md").read_text()
    section = text[text.index("**Train on your own data**"):]
    match = re.match(r".*?```yaml\n(.*?)```\n\n<!-- runnable -->\n```bash\n(rlvr [^\n]*)\n", section, flags=re.S)
    assert match, "the block moved or changed shape"
    return match[1], match[2]


def test_readme_shows_the_example_file():
    yaml, command = own_data_block()
    assert yaml == (ROOT / "examples" / "your_own_data.yaml").read_text()
    assert f"\n    {command}\n" in (ROOT / "README.md").read_text()  # the README's tour gives the same line


@pytest.mark.slow
def test_readme_own_data_command_runs(tmp_path):
    pytest.importorskip("transformers")
    _, command = own_data_block()
    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    done = subprocess.run(["bash", "-c", command], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    records = [json.loads(line) for line in (tmp_path / "runs/your_own_data/metrics.jsonl").open()]
    train = [r for r in records if r["kind"] == "train"]
    assert [r["epoch"] for r in train] == list(range(6))
    assert all(r["reward/gold/scored"] == 16 for r in train)  # 4 prompts x 4 responses, every one graded
    table = [r for r in records if r["kind"] == "samples"][0]["rows"]
    assert table[0]["prompt"][0]["role"] == "user"  # chat prompts, as in the data file
