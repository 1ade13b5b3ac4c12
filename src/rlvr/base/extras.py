"""The optional installs (``pyproject.toml``'s extras), checked before any work so that a missing one is one line
naming the extra, never a traceback from inside a run."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterable

from rlvr.base.errors import ConfigError

# module -> the extra that installs it (huggingface_hub comes with transformers)
EXTRA_OF = {
    "transformers": "lm", "tokenizers": "lm", "safetensors": "lm", "huggingface_hub": "lm", "math_verify": "lm",
    "peft": "lora", "gguf": "gguf",
    "datasets": "data", "pyarrow": "data",
    "reasoning_gym": "reasoning-gym",
    "ray": "ray",
    "vllm": "vllm",
    "tensorboard": "tensorboard", "wandb": "wandb", "trackio": "trackio",
    "textarena": "textarena",
    "starlette": "agents", "uvicorn": "agents", "openai": "agents",
    "verifiers": "verifiers",
    "tinker": "tinker", "zstandard": "tinker",
}
LM_MODULES = ("transformers", "tokenizers", "safetensors", "huggingface_hub")
AGENT_MODULES = ("starlette", "uvicorn", "openai")  # the endpoint agents call (task.name=agent)


def missing_package(module: str) -> str | None:
    """Why ``module`` cannot be imported, as the line that says which extra to install, found without importing it;
    None when it is installed (or already imported)."""
    try:
        if module in sys.modules or importlib.util.find_spec(module) is not None:
            return None
    except (ImportError, ValueError):  # a finder that refuses it, or a module without a spec
        pass
    return f"the {module} package is not installed: pip install 'rlvr[{EXTRA_OF[module]}]'"


def require(what: str, modules: Iterable[str]) -> None:
    """ConfigError "``what``: <``missing_package``>" for the first of ``modules`` that is missing."""
    for module in modules:
        problem = missing_package(module)
        if problem:
            raise ConfigError(f"{what}: {problem}")


def missing_module_hint(err: ImportError) -> str | None:
    """The install line for an ImportError of an optional module (one ``rlvr.config.compose.needed_modules``
    cannot foresee, such as the dataset task's Parquet reader); None for any other."""
    name = (getattr(err, "name", None) or "").split(".")[0]
    return missing_package(name) if name in EXTRA_OF else None
