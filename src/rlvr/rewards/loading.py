"""Reward functions named ``"module:function"``, and the specs of a config's list of them."""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from types import ModuleType
from typing import Any

from rlvr.rewards.calls import RewardError, RewardFn
from rlvr.rewards.combine import RewardSpec


def load_reward_function(path: str) -> RewardFn:
    """Import the reward function named ``"module:function"`` (only that name).

    Raises RewardError for a malformed path, a missing module, a module that fails to
    import, a missing attribute or one that is not callable.
    """
    module_name, _, attr = path.partition(":")
    if not attr or not all(part.isidentifier() for part in module_name.split(".")) or not attr.isidentifier():
        raise RewardError(
            f"reward function {path!r}: expected 'module:function', "
            "e.g. 'rlvr.tasks.gsm8k:answer_reward'"
        )
    module = _import(path, module_name)
    if not hasattr(module, attr):
        raise RewardError(f"reward function {path!r}: module {module_name!r} has no {attr!r}{_defined(module)}")
    fn = getattr(module, attr)
    if not callable(fn):
        raise RewardError(
            f"reward function {path!r}: {attr!r} is a {type(fn).__name__}, not a callable"
        )
    return fn


def load_reward_specs(
    items: Sequence[str | dict[str, Any]], timeout: float | None, where: str = "functions"
) -> list[RewardSpec]:
    """RewardSpecs of a list of functions, each ``"module:function"`` or a dict
    ``{function, weight: 1.0, name: '', timeout: <timeout>, required: false}``.

    Raises RewardError naming the item (``where[i]``) whose function does not load.
    """
    specs = []
    for i, item in enumerate(items):
        item = {"function": item} if isinstance(item, str) else item
        try:
            fn = load_reward_function(item["function"])
        except RewardError as err:
            raise RewardError(f"{where}[{i}]: {err}") from err
        specs.append(RewardSpec(
            fn, float(item.get("weight", 1.0)), item.get("name", ""), item.get("timeout", timeout),
            item.get("required", False),
        ))
    return specs


def _import(path: str, module_name: str) -> ModuleType:
    """The module of ``path``; a RewardError that tells a missing module from one whose
    own import fails."""
    dotted = module_name.split(".")
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name in {".".join(dotted[: i + 1]) for i in range(len(dotted))}:
            raise RewardError(f"reward function {path!r}: no module named {exc.name!r}") from exc
        raise RewardError(f"reward function {path!r}: importing {module_name!r} failed: {exc}") from exc
    except Exception as exc:  # the module's own import-time failure: say which import, keep the cause
        raise RewardError(
            f"reward function {path!r}: importing {module_name!r} raised {type(exc).__name__}: {exc}"
        ) from exc


def _defined(module: ModuleType) -> str:
    """"; it defines: f, g" for the public callables the module itself defines, else ""."""
    defined = sorted(
        name
        for name, value in vars(module).items()
        if callable(value) and not name.startswith("_")
        and getattr(value, "__module__", None) == module.__name__
    )
    return f"; it defines: {', '.join(defined)}" if defined else ""
