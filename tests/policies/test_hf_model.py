"""Where a model comes from (``rlvr.policies.hf_model.locate_model``): a local folder, the hub cache
or the hub, and a hub name that cannot be reached named at once, offline."""

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import QUIET, cli


def _offline_env(tmp_path: Path) -> dict:
    """No network to the hub (a port that refuses at once) and an empty or given cache."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env.update(HF_ENDPOINT="http://127.0.0.1:9", HF_HOME=str(tmp_path / "hf"))
    return env


def test_hub_name_not_available_offline_fails_fast_naming_the_model(tmp_path):
    start = time.monotonic()
    proc = cli("train", f"out_dir={tmp_path / 'run'}", "task.name=sort_text", "policy.name=causal_lm",
               "policy.options={model: nobody/no-such-model}", *QUIET, env=_offline_env(tmp_path), timeout=40)
    seconds = time.monotonic() - start
    assert proc.returncode == 2, proc.stderr
    assert "nobody/no-such-model" in proc.stderr and "policy.options.model" in proc.stderr
    assert "Retrying" not in proc.stderr
    assert seconds < 15  # python start and imports; before: 5 retries, ~50 s
    assert not (tmp_path / "run").exists()


def test_locate_model_offline(tmp_path, tiny_model):
    from rlvr.policies.hf_model import locate_model

    code = ("import sys; from rlvr.policies.hf_model import locate_model\n"
            "try:\n    print(locate_model(sys.argv[1]))\nexcept FileNotFoundError as err:\n"
            "    print('error:', err); sys.exit(2)\n")
    env = _offline_env(tmp_path)
    start = time.monotonic()
    missing = subprocess.run([sys.executable, "-c", code, "nobody/no-such-model"], env=env, capture_output=True,
                             text=True, timeout=30)
    assert missing.returncode == 2 and "nobody/no-such-model" in missing.stdout
    assert "cannot be reached" in missing.stdout and time.monotonic() - start < 10
    # A model in the hub cache loads offline from its snapshot folder.
    repo = tmp_path / "hf" / "hub" / "models--somebody--tiny"
    shutil.copytree(tiny_model, repo / "snapshots" / "abc123")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("abc123")
    cached = subprocess.run([sys.executable, "-c", code, "somebody/tiny"], env=env, capture_output=True, text=True,
                            timeout=30)
    assert cached.returncode == 0, cached.stdout + cached.stderr
    assert Path(cached.stdout.strip()) == repo / "snapshots" / "abc123"
    # A local folder is itself; a path that is not there is an error naming it, with no hub call.
    assert locate_model(str(tiny_model)) == str(tiny_model)
    with pytest.raises(FileNotFoundError, match="no folder"):
        locate_model(str(tmp_path / "nothing" / "here"))
