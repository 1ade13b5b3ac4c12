"""The loop's seams point one way: nothing in rlvr.cluster imports the loop (rlvr.trainer),
and the modules both sides share (the step, the local parts, the state) import neither."""

import ast
from pathlib import Path

import rlvr

SRC = Path(rlvr.__file__).resolve().parent


def imported_modules(path: Path) -> set[str]:
    """Every module ``path`` imports, at the top or inside a function (``from rlvr import
    trainer`` counts as ``rlvr.trainer``)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module is not None and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def test_no_module_of_rlvr_cluster_imports_the_loop():
    modules = sorted((SRC / "cluster").glob("*.py"))
    assert len(modules) >= 5
    for path in modules:
        assert "rlvr.trainer" not in imported_modules(path), path.name


def test_the_step_the_local_parts_and_the_state_import_neither_the_loop_nor_the_cluster():
    for name in ("step.py", "seams.py", "state.py"):
        imports = imported_modules(SRC / name)
        assert not {m for m in imports if m == "rlvr.trainer" or m.startswith("rlvr.cluster")}, name


def test_the_check_sees_every_form_of_import(tmp_path):
    path = tmp_path / "m.py"
    path.write_text("import rlvr.trainer as t\nfrom rlvr import trainer\ndef f():\n    from rlvr.trainer import x\n")
    assert "rlvr.trainer" in imported_modules(path)
    path.write_text("from rlvr import trainer\n")
    assert "rlvr.trainer" in imported_modules(path)
