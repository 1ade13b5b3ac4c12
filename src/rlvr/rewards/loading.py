"""Reward functions named ``"module:function"``, and the specs of a config's list of them.

A module is looked up on ``sys.path`` first, then in the current working directory (a user's ``my_rewards.py`` next
to the YAML): the directory is appended to ``sys.path`` then, last, so a file there never hides an installed
package, and workers started with "spawn" (which copy ``sys.path``) find it too.

An entry of a config's list may also be a Python callable, bare or as the ``function`` of a dict
(``rlvr.train(config, reward_funcs=[fn])``). Reward workers start with "fork" and inherit it, so lambdas and
closures work there too; where fork does not exist, one that does not pickle is an error naming it.
"""

from __future__ import annotations

import functools
import importlib
import os
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import Any

from rlvr.rewards.calls import RewardError, RewardFn
from rlvr.rewards.combine import RewardSpec


def load_reward_function(path: str) -> RewardFn:
    """Import the reward function named ``"module:function"`` (only that name); RewardError for a malformed path, a
    module that is missing or fails to import, a missing attribute or one that is not callable."""
    module_name, _, attr = path.partition(":")
    if not attr or not all(part.isidentifier() for part in module_name.split(".")) or not attr.isidentifier():
        raise RewardError(f"reward function {path!r}: expected 'module:function', "
                          "e.g. 'rlvr.tasks.gsm8k:answer_reward'")
    module = _import(path, module_name, module_name.split(".")[0])
    if not hasattr(module, attr):
        raise RewardError(f"reward function {path!r}: module {module_name!r} has no {attr!r}{_defined(module)}")
    fn = getattr(module, attr)
    if not callable(fn):
        raise RewardError(f"reward function {path!r}: {attr!r} is a {type(fn).__name__}, not a callable")
    return fn


def load_reward_specs(
    items: Sequence[str | dict[str, Any]], timeout: float | None, where: str = "functions"
) -> list[RewardSpec]:
    """RewardSpecs of a list of functions, each ``"module:function"``, a callable, or a dict ``{function, weight: 1.0,
    name: '', timeout: <timeout>, required: false, options: {}}`` whose function is either; ``options`` are bound
    to it (``functools.partial``). RewardError naming the item (``where[i]``) whose function does not load."""
    specs = []
    for i, item in enumerate(items):
        item = item if isinstance(item, dict) else {"function": item}
        fn = item.get("function")
        try:
            if isinstance(fn, str):
                fn = load_reward_function(fn)
            elif not callable(fn):
                raise RewardError(f"expected 'module:function' or a callable, got {type(fn).__name__} {fn!r:.60}")
        except RewardError as err:
            raise RewardError(f"{where}[{i}]: {err}") from err
        if item.get("options"):
            fn = functools.partial(fn, **item["options"])
        specs.append(RewardSpec(
            fn, float(item.get("weight", 1.0)), item.get("name", ""), item.get("timeout", timeout),
            item.get("required", False),
        ))
    return specs


def _import(path: str, module_name: str, top: str) -> ModuleType:
    """The module of ``path`` (``top`` its first name), from ``sys.path`` or else the working directory; a
    RewardError that tells a missing module from one whose own import fails."""
    dotted = module_name.split(".")
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name in {".".join(dotted[: i + 1]) for i in range(len(dotted))}:
            if exc.name == top and look_in_working_directory(top):
                return _import(path, module_name, top)
            raise RewardError(f"reward function {path!r}: no module named {exc.name!r} "
                              f"(looked on sys.path and in {os.getcwd()})") from exc
        raise RewardError(f"reward function {path!r}: importing {module_name!r} failed: {exc}") from exc
    except Exception as exc:  # the module's own import-time failure: say which import, keep the cause
        raise RewardError(f"reward function {path!r}: importing {module_name!r} raised {type(exc).__name__}: {exc}"
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


def look_in_working_directory(top: str) -> bool:
    """Append the working directory to ``sys.path`` (last) when it holds the module ``top`` and is not there yet:
    whether it was."""
    cwd = os.getcwd()
    if not _in_directory(top, cwd) or cwd in sys.path:
        return False
    sys.path.append(cwd)
    importlib.invalidate_caches()
    return True


def _in_directory(top: str, directory: str) -> bool:
    """Is there a module ``top`` (a file or a package folder) in ``directory``?"""
    return os.path.isfile(os.path.join(directory, f"{top}.py")) or os.path.isdir(os.path.join(directory, top))
