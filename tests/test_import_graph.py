"""Layering: the imports between sapiens2's subpackages and top-level modules form no cycle, the fact tables
(``tasks``, ``metadata``) import nothing from sapiens2, and the bottom layers (``models``, ``data``) nothing but them.

Every module is parsed with ``ast``; imports at any depth count (lazy ones inside functions, ``TYPE_CHECKING``
blocks), relative and absolute alike. A graph node is ``sapiens2.<first name>``: a subpackage or a top-level module.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest
from conftest import REPO

PACKAGE = REPO / "sapiens2"
ROOT = "sapiens2"
# The fact tables every layer may read: the task table and the packaged asset metadata.
FACTS = ("sapiens2.tasks", "sapiens2.metadata")
# Packages that must stay at the bottom: networks (models), image io and transforms (data), and the fact tables.
LEAVES = ("sapiens2.models", "sapiens2.data", *FACTS)
# Upward calls allowed as a lazy import inside one named method only: (file, imported node). Predictor.video hands
# the predictor to the video package, which sits above predict; the edge is left out of the cycle check.
UPWARD_HOOKS = {("sapiens2/predict/predictor.py", "sapiens2.video")}


def _module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _node(module: str) -> str:
    """``sapiens2.pose.topdown`` -> ``sapiens2.pose``; ``sapiens2`` stays the package root."""
    return ".".join(module.split(".")[:2])


def _is_submodule(module: str) -> bool:
    relative = Path(*module.split(".")[1:])
    return (PACKAGE / relative).is_dir() or (PACKAGE / relative).with_suffix(".py").is_file()


def _imported_modules(path: Path) -> list[tuple[str, int]]:
    """(absolute module name, line) of every sapiens2 import in a file, at any depth."""
    module = _module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            # ``from sapiens2 import checkpoints`` / ``from .. import pose`` name submodules, not the root.
            for alias in node.names:
                submodule = f"{target}.{alias.name}"
                found.append((submodule if _is_submodule(submodule) else target, node.lineno))
    return [(name, line) for name, line in found if name == ROOT or name.startswith(ROOT + ".")]


def _import_graph() -> dict[str, dict[str, str]]:
    """node -> {imported node: "file:line" of the first import that makes the edge}."""
    graph: dict[str, dict[str, str]] = defaultdict(dict)
    for path in sorted(PACKAGE.rglob("*.py")):
        source = _node(_module_name(path))
        graph[source]  # every node appears, with or without edges
        for target, line in _imported_modules(path):
            target = _node(target)
            if (path.relative_to(REPO).as_posix(), target) in UPWARD_HOOKS:
                continue
            if target != source:
                graph[source].setdefault(target, f"{path.relative_to(REPO)}:{line}")
    return graph


def _find_cycle(graph: dict[str, dict[str, str]]) -> list[str] | None:
    """One cycle as [a, b, ..., a], or None (depth-first search, nodes in sorted order)."""
    state: dict[str, str] = {}  # "active" while on the current path, "done" once fully explored
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = "active"
        path.append(node)
        for target in sorted(graph.get(node, {})):
            if state.get(target) == "active":
                return path[path.index(target) :] + [target]
            if target not in state and (cycle := visit(target)):
                return cycle
        path.pop()
        state[node] = "done"
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_relative_and_lazy_imports_are_found():
    graph = _import_graph()
    assert "sapiens2.checkpoints" in graph["sapiens2.pose"]  # a lazy ``from ..checkpoints import`` in a function
    assert "sapiens2.data" in graph["sapiens2.dense"]  # absolute imports
    assert {"sapiens2.models", "sapiens2.predict"} <= set(graph[ROOT])  # the public API re-exports


def test_subpackages_import_each_other_without_cycles():
    graph = _import_graph()
    cycle = _find_cycle(graph)
    if cycle is not None:
        steps = "\n".join(f"  {a} -> {b}  ({graph[a][b]})" for a, b in zip(cycle[:-1], cycle[1:], strict=True))
        pytest.fail(f"import cycle {' -> '.join(cycle)}:\n{steps}")


@pytest.mark.parametrize("leaf", LEAVES)
def test_bottom_layers_import_no_other_sapiens2_package(leaf):
    imports = {target: where for target, where in _import_graph()[leaf].items() if target not in FACTS or leaf in FACTS}
    assert not imports, f"{leaf} imports " + ", ".join(f"{target} ({where})" for target, where in imports.items())


def test_upward_hooks_are_lazy_imports_inside_functions():
    for file, target in UPWARD_HOOKS:
        tree = ast.parse((REPO / file).read_text(encoding="utf-8"))
        top_level = {line for node in tree.body for line in range(node.lineno, (node.end_lineno or node.lineno) + 1)
                     if not isinstance(node, (ast.FunctionDef, ast.ClassDef))}
        hooks = [line for name, line in _imported_modules(REPO / file) if _node(name) == target]
        assert hooks, f"{file} no longer imports {target}: drop it from UPWARD_HOOKS"
        assert not set(hooks) & top_level, f"{file} imports {target} at module level (lines {hooks})"


def test_only_the_cli_imports_the_demo_and_gradio_loads_lazily():
    """The web page is the top layer beside the CLI; Gradio (an optional extra) is imported only inside functions of
    ``sapiens2/demo``, so ``import sapiens2.demo`` and ``sapiens2 demo --help`` work without it."""
    importers = {node for node, targets in _import_graph().items() if "sapiens2.demo" in targets}
    assert importers <= {"sapiens2.cli", "sapiens2.demo"}, f"sapiens2.demo is imported by {sorted(importers)}"
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in tree.body:  # module level only
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            names += [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            assert not any(n.split(".")[0] == "gradio" for n in names), f"{path}:{node.lineno} imports gradio eagerly"


def test_pretrain_sits_above_train_and_below_cli():
    graph = _import_graph()
    assert "sapiens2.train" in graph["sapiens2.pretrain"]  # it reuses the training loop
    assert not {"sapiens2.pretrain"} & (set(graph["sapiens2.train"]) | set(graph["sapiens2.models"]))
    assert "sapiens2.pretrain" in graph["sapiens2.cli"]


def test_curate_sits_above_bulk_and_below_cli_and_its_optional_libraries_load_lazily():
    """Only the CLI imports ``sapiens2.curate``; faiss, pandas, pyarrow and ray (the ``[curate]``/``[ray]`` extras) are
    imported inside its functions, so ``sapiens2 --help`` works without them."""
    graph = _import_graph()
    assert "sapiens2.bulk" in graph["sapiens2.curate"]  # the per-image scores run as a bulk job
    importers = {node for node, targets in graph.items() if "sapiens2.curate" in targets}
    assert importers <= {"sapiens2.cli", "sapiens2.curate"}, f"sapiens2.curate is imported by {sorted(importers)}"
    for path in sorted((PACKAGE / "curate").rglob("*.py")):
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            names += [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            eager = {n.split(".")[0] for n in names} & {"faiss", "pandas", "pyarrow", "ray"}
            assert not eager, f"{path}:{node.lineno} imports {eager} at module level"


def test_bulk_engine_knows_no_model_and_its_optional_libraries_load_lazily():
    """``sapiens2.bulk`` (ledger, sinks, engines) sits on ``data`` alone, so any job can use it; predict plugs in from
    above. Ray, pyarrow and fsspec (the ``[ray]``/``[parquet]``/``[remote]`` extras) are imported inside functions
    in ``bulk`` and ``data.collections``, so the core install imports them nowhere."""
    graph = _import_graph()
    assert set(graph["sapiens2.bulk"]) <= {"sapiens2.data", *FACTS}, sorted(graph["sapiens2.bulk"])
    assert "sapiens2.bulk" in graph["sapiens2.predict"]
    for path in [*sorted((PACKAGE / "bulk").rglob("*.py")), PACKAGE / "data" / "collections.py"]:
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            names += [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            eager = {n.split(".")[0] for n in names} & {"ray", "pyarrow", "fsspec", "torch"}
            assert not eager, f"{path}:{node.lineno} imports {eager} at module level"
