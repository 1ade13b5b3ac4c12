"""The package's layers (the layout page, docs/explanation/layout.md): every import of
every module under src/rlvr, read with ``ast`` (those inside functions and under
TYPE_CHECKING included), points to a module of its own layer or a lower one, and no
modules import each other in a cycle."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"

# module prefix -> layer; the longest prefix that matches a module decides. Imports go to the
# same layer or below.
LAYERS = {
    # pure tensor math
    "rlvr.core": 0,
    # what every part shares: errors, declared rules, optional installs, data files, process
    # limits (rlvr.base); the batch, its interfaces and a step's record (rlvr.batch); tiny models
    # and their loading (rlvr.modeling)
    "rlvr.base": 1, "rlvr.batch": 1, "rlvr.modeling": 1,
    # the parts that take plain arguments; rewards and engines know no task or policy
    "rlvr.rewards": 2, "rlvr.engines": 2,
    "rlvr.tasks": 3, "rlvr.policies": 3, "rlvr.environments": 3, "rlvr.agents": 3,
    # the typed config reads the parts' registries (names, option rules); the composition root
    # builds the parts from it
    "rlvr.config": 4, "rlvr.config.compose": 5,
    # the loop (rlvr.loop): the optimizer built from its section; one optimizer step, the same
    # in every learner; the training state it updates; the measurements the step and the loop
    # take (the noise meter is part of every step); the loop's seams and what it calls; the
    # loop; many toy runs as one; the supervised warm start
    "rlvr.loop.optim": 5,
    "rlvr.loop.state": 6, "rlvr.loop.step": 6, "rlvr.loop.diagnostics": 6,
    "rlvr.loop.seams": 7, "rlvr.loop.shaping": 7, "rlvr.loop.dynamic_sampling": 7, "rlvr.loop.evaluation": 7,
    "rlvr.cluster": 7, "rlvr.tinker": 7, "rlvr.loop.trainer": 8, "rlvr.loop.sft": 9, "rlvr.loop": 9,
    # a run on disk (rlvr.runs), then the library's entry points, then the command line
    "rlvr.runs": 10, "rlvr.runs.export": 11,
    "rlvr.api": 12, "rlvr": 12,
    "rlvr.cli": 13, "rlvr.__main__": 13,
}
# the cluster sits beside the loop: it may use the step, seams and state, never the trainer, and
# the loop takes its seams from its caller, never from the cluster, and writes no run directory
# (a run on disk calls the loop, not the other way); policies render and sample,
# and know no environment or agent; a task knows no policy (a prompt's error is rlvr.base.errors')
FORBIDDEN = {"rlvr.cluster": ("rlvr.loop.trainer",), "rlvr.loop": ("rlvr.cluster", "rlvr.runs"),
             "rlvr.policies": ("rlvr.environments", "rlvr.agents"), "rlvr.tasks": ("rlvr.policies",)}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted((SRC / "rlvr").rglob("*.py"))}


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The rlvr modules ``name`` imports anywhere in its file (``from pkg import mod`` names mod)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found.update(f"{target}.{a.name}" if f"{target}.{a.name}" in known else target for a in node.names)
    return {m for m in found if m in known and m != name}


def layer(name: str) -> int:
    prefix = max((p for p in LAYERS if name == p or name.startswith(p + ".")), key=len, default=None)
    assert prefix is not None, f"{name} is in no layer: add it to LAYERS"
    return LAYERS[prefix]


def graph() -> dict[str, set[str]]:
    found = modules()
    return {name: imports(name, path, set(found)) for name, path in found.items()}


def test_every_import_points_down_or_across():
    wrong = [f"{a} (layer {layer(a)}) imports {b} (layer {layer(b)})"
             for a, deps in graph().items() for b in sorted(deps) if layer(b) > layer(a)]
    wrong += [f"{a} imports {b}" for a, deps in graph().items() for owner, banned in FORBIDDEN.items()
              if a.startswith(owner) for b in deps if b.startswith(banned)]
    assert not wrong, "\n".join(wrong)


def test_no_import_cycles():
    edges = graph()
    cycles, state = [], {}  # state: 1 on the path, 2 done

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(edges[node]):
            if state.get(nxt) == 1:
                cycles.append(" -> ".join(path[path.index(nxt):] + [node, nxt]) if nxt in path else f"{node} -> {nxt}")
            elif nxt not in state:
                visit(nxt, path + [node])
        state[node] = 2

    for node in sorted(edges):
        if node not in state:
            visit(node, [])
    assert not cycles, "\n".join(cycles)


def test_the_table_names_every_module_and_the_core_imports_nothing_of_rlvr():
    edges = graph()
    assert all(layer(name) >= 0 for name in edges)
    assert all(b.startswith("rlvr.core") for a, deps in edges.items() if a.startswith("rlvr.core") for b in deps)


def package(name: str) -> str:
    """A module's package under rlvr (``rlvr.tasks.dataset`` -> ``rlvr.tasks``); a top-level module is its own."""
    parts = name.split(".")
    return ".".join(parts[:2])


def test_no_import_cycle_between_packages():
    """Read package by package (every module of a package as one node), the imports form no
    cycle: policies and environments, tasks and policies, no longer lean on each other."""
    edges: dict[str, set[str]] = {}
    for a, deps in graph().items():
        edges.setdefault(package(a), set()).update(package(b) for b in deps if package(b) != package(a))
    packages = {p for p in edges if p.count(".") == 1 and (SRC / p.replace(".", "/")).is_dir()}
    cycles, state = [], {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(edges.get(node, ())):
            if nxt not in packages:
                continue
            if state.get(nxt) == 1:
                cycles.append(" -> ".join([*path[path.index(nxt):], node, nxt]) if nxt in path else f"{node} -> {nxt}")
            elif nxt not in state:
                visit(nxt, [*path, node])
        state[node] = 2

    for node in sorted(packages):
        if node not in state:
            visit(node, [])
    assert not cycles, "\n".join(cycles)


def test_the_reader_sees_every_form_of_import(tmp_path):
    known = {"rlvr.loop", "rlvr.loop.trainer", "rlvr.cluster", "rlvr.cluster.session"}
    path = tmp_path / "m.py"
    for text in ("import rlvr.loop.trainer as t\n", "from rlvr.loop import trainer\n",
                 "def f():\n    from rlvr.loop.trainer import x\n",
                 "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from rlvr.loop.trainer import x\n"):
        path.write_text(text)
        assert "rlvr.loop.trainer" in imports("rlvr.cluster.session", path, known), text
    path.write_text("from . import session\n")
    assert imports("rlvr.cluster.m", path, known) == {"rlvr.cluster.session"}

