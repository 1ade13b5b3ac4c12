"""What many tests share: the quiet run settings and a tiny language model built offline."""

from __future__ import annotations

import pytest

# A run that draws no progress bar and no figure (the tests read metrics, not pictures).
QUIET = ["log.progress=false", "log.plot=false"]


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    """A 2-layer Llama (hidden 32) with a character tokenizer, written by ``init_model``:
    the model every language-model test trains (a few hundred ms to build, once)."""
    pytest.importorskip("transformers")
    from rlvr.modeling import init_model

    out = tmp_path_factory.mktemp("tiny") / "model"
    init_model(out, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=2, seed=0)
    return out
