"""``threads``: 1 for the positional toy, torch's default (the cores) for a causal LM, unless set."""

from __future__ import annotations

import pytest
import torch

from rlvr.config import DEFAULT_TORCH_THREADS, load_config
from rlvr.loop.trainer import setup

LM = ["task.name=sort_text", "task.options={num_digits: 3, num_eval: 8}", "policy.name=causal_lm"]


@pytest.fixture
def restore_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_null_threads_mean_one_for_the_toy_and_the_cores_for_an_lm():
    assert load_config(None, []).threads is None
    assert load_config(None, []).torch_threads == 1  # the toy's ops are too small to split
    assert load_config(None, LM).torch_threads == DEFAULT_TORCH_THREADS
    for count in (0, 1, 3):  # an explicit value wins, 0 (leave torch's setting) included
        assert load_config(None, [f"threads={count}"]).torch_threads == count
        assert load_config(None, [*LM, f"threads={count}"]).torch_threads == count


def run_setup(overrides: list[str]) -> None:
    task, _ = setup(load_config(None, overrides))
    close = getattr(task, "close", None)  # its reward workers
    if close is not None:
        close()


def test_setup_sets_the_resolved_thread_count(llama_dir, restore_threads):
    torch.set_num_threads(2)
    run_setup([])
    assert torch.get_num_threads() == 1
    lm = [*LM, f"policy.options={{model: '{llama_dir}', max_new_tokens: 8}}"]
    torch.set_num_threads(DEFAULT_TORCH_THREADS + 1)  # not the default already (one thread a pytest-xdist worker)
    run_setup(lm)
    assert torch.get_num_threads() == DEFAULT_TORCH_THREADS
    torch.set_num_threads(1)
    run_setup([*lm, "threads=0"])
    assert torch.get_num_threads() == 1  # 0: left as it was
