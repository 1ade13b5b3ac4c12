"""Cluster settings that cannot work are refused in one line (exit 2) before a run directory is made."""

import pytest

from rlvr.cli import main
from rlvr.config import ConfigError, load_config

QUICK = ["algo.epochs=1", "log.progress=false"]


@pytest.mark.parametrize(("override", "message"), [
    ("cluster.address=../../etc cluster.rollout_workers=1",
     "cluster.address='../../etc' is not a Ray cluster address; give auto, HOST:PORT"),
    ("cluster.split_batch=true", "cluster.split_batch=true splits each batch over the rollout workers, and "
                                 "cluster.rollout_workers=0"),
])
def test_refused_in_one_line_before_a_run_directory(tmp_path, monkeypatch, capsys, override, message):
    """Refused by the config's rules: Ray is never started (before, ray.init's ValueError came as a traceback)."""
    monkeypatch.chdir(tmp_path)
    assert main(["train", *override.split(), *QUICK]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"rlvr: error: {message}") and err.count("\n") == 1
    assert list(tmp_path.iterdir()) == []  # no runs/ folder, no run directory


@pytest.mark.parametrize("address", ["auto", "10.0.0.1:6379", "head-node.local:6379", "[::1]:6379",
                                     "ray://10.0.0.1:10001"])
def test_ray_addresses_pass(address):
    assert load_config(None, [f"cluster.address='{address}'"]).cluster.address == address


@pytest.mark.parametrize("address", ["", "local", "6379", "head:", "head:0", "head:65536", "head:63 79", "..:6379",
                                     "http://head:6379", "head:6379/x"])
def test_other_addresses_are_refused(address):
    with pytest.raises(ConfigError, match="is not a Ray cluster address"):
        load_config(None, [f"cluster.address='{address}'"])


def test_split_batch_with_rollout_workers_passes():
    config = load_config(None, ["cluster.split_batch=true", "cluster.rollout_workers=2", "task.prompts=null"])
    assert config.cluster.split_batch
