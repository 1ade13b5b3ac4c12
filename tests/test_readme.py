"""The README's Python example and the getting-started page's reasoning-gym lines run as written."""

import re
from pathlib import Path

import pytest

from helpers import shell

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_python_example_runs():
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert blocks
    scope: dict = {}
    exec(blocks[0], scope)  # the project's own documentation, not model output
    records = scope["records"]
    train = [r for r in records if r["kind"] == "train"]
    # The lecture's run: 100 epochs x 10 inner steps, evaluated at the start and every 10 epochs.
    assert [(r["epoch"], r["step"]) for r in train] == [(s // 10, s) for s in range(1000)]
    assert [r["epoch"] for r in records if r["kind"] == "eval"] == list(range(0, 101, 10))
    first, last = (sum(r["reward_mean"] for r in part) / 100 for part in (train[:100], train[-100:]))
    assert last > first  # normalized deltas learn on the lecture's prompts


@pytest.mark.slow
def test_readme_reasoning_gym_lines_run_as_written(workdir):
    pytest.importorskip("reasoning_gym")
    text = (README.parent / "docs" / "tutorials" / "getting-started.md").read_text()
    section = text[text.index("**Train on generated problems**"):]
    command = re.search(r"```bash\n(rlvr init-model [^\n]*)\n", section)[1]
    done = shell(command + " algo.epochs=1", workdir)
    assert done.returncode == 0, done.stderr[-2000:]
    metrics = (workdir / "runs" / "reasoning_gym_tiny" / "metrics.jsonl").read_text()
    assert '"kind": "train"' in metrics and '"reward/score/scored": 16' in metrics  # 4 prompts x 4, all graded
