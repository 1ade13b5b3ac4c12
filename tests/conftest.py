"""What many tests share: the quiet run settings, a tiny language model built offline, a private Ray."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# A run that draws no progress bar and no figure (the tests read metrics, not pictures).
QUIET = ["log.progress=false", "log.plot=false"]

# GSM8K lives beside the checkout (../shared/data/gsm8k); its tests skip without it.
GSM8K_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "gsm8k"


def pytest_terminal_summary(terminalreporter):
    """One line when GSM8K tests were skipped for want of the data, so they are not missed."""
    if not (GSM8K_DATA / "test.jsonl").is_file():
        skipped = [r for r in terminalreporter.stats.get("skipped", []) if "GSM8K" in str(r.longrepr)]
        if skipped:
            terminalreporter.write_line(f"GSM8K data not found at {GSM8K_DATA}: {len(skipped)} GSM8K "
                                        f"test{'s' * (len(skipped) > 1)} skipped (put train.jsonl and test.jsonl "
                                        "there to run them; see README, Run the tests)")


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    """A 2-layer Llama (hidden 32) with a character tokenizer, written by ``init_model``:
    the model every language-model test trains (a few hundred ms to build, once)."""
    pytest.importorskip("transformers")
    from rlvr.modeling import init_model

    out = tmp_path_factory.mktemp("tiny") / "model"
    init_model(out, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=2, seed=0)
    return out


@pytest.fixture(scope="module")
def ray_local():
    """A private Ray instance for one test module (never someone else's cluster)."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    ray = pytest.importorskip("ray")
    ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level="ERROR")
    yield ray
    ray.shutdown()
