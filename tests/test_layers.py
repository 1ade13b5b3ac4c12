"""The package's layers (``DESIGN.md``, "Parts, and what each may know"): every import of
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
    # contracts and base utilities every part may use: the batch and its interfaces (rollout),
    # the one-line errors, metric records and sinks, the rule check, the generic config loader
    # (settings, and the foreign names it maps), which optional install each back end needs
    # (extras), tiny models and loading (modeling), data files (data)
    "rlvr.rollout": 1, "rlvr.errors": 1, "rlvr.metrics": 1, "rlvr.rules": 1, "rlvr.settings": 1,
    "rlvr.trl_names": 1, "rlvr.extras": 1, "rlvr.modeling": 1, "rlvr.data": 1,
    # the parts that take plain arguments; rewards and engines know no task or policy
    "rlvr.rewards": 2, "rlvr.engines": 2,
    "rlvr.tasks": 3, "rlvr.policies": 3, "rlvr.environments": 3, "rlvr.agents": 3,
    # the typed config reads the parts' registries (names, option rules); the composition root
    # builds the parts from it; the optimizer is built from its section
    "rlvr.presets": 4, "rlvr.config": 4, "rlvr.config_rules": 4,
    "rlvr.compose": 5, "rlvr.optim": 5,
    # one optimizer step, the same in every learner; the training state it updates; the
    # measurements the step and the loop take (the noise meter is part of every step)
    "rlvr.state": 6, "rlvr.step": 6, "rlvr.diagnostics": 6,
    # the loop and what it calls
    "rlvr.seams": 7, "rlvr.shaping": 7, "rlvr.dynamic_sampling": 7, "rlvr.evaluation": 7,
    "rlvr.cluster": 7, "rlvr.trainer": 8, "rlvr.batched": 9,
    # a run on disk, then the library's entry points, then the command line
    "rlvr.run_dir": 10, "rlvr.checkpoint": 10, "rlvr.resume": 10, "rlvr.runs": 10, "rlvr.sft": 10,
    "rlvr.report": 10, "rlvr.run_records": 10, "rlvr.export": 11,
    "rlvr.api": 12, "rlvr": 12,
    "rlvr.cli": 13, "rlvr.__main__": 13,
    # the docs' reference pages, made from the config, the tasks and the command line's parsers
    "rlvr.reference_pages": 14,
}
# the cluster sits beside the loop: it may use the step, seams and state, never the trainer, and
# the loop takes its seams from its caller, never from the cluster; policies render and sample,
# and know no environment or agent; a task knows no policy (a prompt's error is rlvr.errors')
FORBIDDEN = {"rlvr.cluster": ("rlvr.trainer",), "rlvr.trainer": ("rlvr.cluster",),
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
