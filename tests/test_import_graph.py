"""Layering: the imports of sapiens2 form no cycle, between packages or between modules, follow the layer diagram of
``docs/architecture.md`` downwards only, and take no private name from another module.

Every module is parsed with ``ast``; imports at any depth count (lazy ones inside functions, ``TYPE_CHECKING``
blocks), relative and absolute alike. Two graphs: modules (``sapiens2.pose.topdown``), and nodes (``sapiens2.<first
name>``: a subpackage or a top-level module; ``sapiens2`` itself is the package's ``__init__``, the public API).

The private-name rule: a name with one leading underscore (``_build``, ``_Track``; not ``__version__``) belongs to
the module that defines it. No other module imports it, reads it off an imported module, or re-exports it, not even
its own package's ``__init__``: a piece two modules share gets a public name and a home below both.
"""

from __future__ import annotations

import ast
import functools
import re
from collections import defaultdict
from pathlib import Path

import pytest
from conftest import REPO

PACKAGE = REPO / "sapiens2"
ROOT = "sapiens2"
ARCHITECTURE = REPO / "docs" / "architecture.md"
# The bottom modules every layer may read: the task table, the packaged asset metadata, the one form of error lines and
# the C heap's policies.
FACTS = ("sapiens2.tasks", "sapiens2.metadata", "sapiens2.messages", "sapiens2.memory")
# Packages that must stay at the bottom: networks (models), image io and transforms (data), the typed YAML reader,
# and the fact tables.
LEAVES = ("sapiens2.models", "sapiens2.data", "sapiens2.yaml_config", *FACTS)


def _module_name(path: Path, package: Path = PACKAGE) -> str:
    parts = path.relative_to(package.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _node(module: str) -> str:
    """``sapiens2.pose.topdown`` -> ``sapiens2.pose``; ``sapiens2`` stays the package root."""
    return ".".join(module.split(".")[:2])


def _is_submodule(module: str, package: Path = PACKAGE) -> bool:
    relative = Path(*module.split(".")[1:])
    return (package / relative).is_dir() or (package / relative).with_suffix(".py").is_file()


def _aliases(node: ast.Import | ast.ImportFrom, parent: str, package: Path) -> list[tuple[ast.alias, str, str | None]]:
    """(alias, absolute module, name taken from it or None) for each name an import statement takes from the package.

    ``from a import b`` where ``a.b`` is a module gives (``a.b``, None); where ``b`` is a name, (``a``, ``b``).
    """
    if isinstance(node, ast.Import):
        found = [(alias, alias.name, None) for alias in node.names]
    else:
        if node.level:
            base = parent.split(".")[: len(parent.split(".")) - (node.level - 1)]
            target = ".".join(base + ([node.module] if node.module else []))
        else:
            target = node.module or ""
        # ``from sapiens2 import checkpoints`` / ``from .. import pose`` name submodules, not the root.
        found = []
        for alias in node.names:
            submodule = f"{target}.{alias.name}"
            found.append((alias, submodule, None) if _is_submodule(submodule, package) else (alias, target, alias.name))
    root = package.name
    return [(alias, name, taken) for alias, name, taken in found if name == root or name.startswith(root + ".")]


def _parent(path: Path, package: Path) -> str:
    """The package relative imports in ``path`` start from."""
    module = _module_name(path, package)
    return module if path.name == "__init__.py" else module.rpartition(".")[0]


def _imported_modules(path: Path, package: Path = PACKAGE) -> list[tuple[str, int]]:
    """(absolute module name, line) of every import of the package in a file, at any depth."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found += [(name, node.lineno) for _, name, _ in _aliases(node, _parent(path, package), package)]
    return found


@functools.cache  # read-only once built: every test shares one parse of the package
def _module_graph(package: Path = PACKAGE) -> dict[str, dict[str, str]]:
    """module -> {imported module: "file:line" of its first import}; packages count as their ``__init__``."""
    graph: dict[str, dict[str, str]] = defaultdict(dict)
    for path in sorted(package.rglob("*.py")):
        source = _module_name(path, package)
        graph[source]  # every module appears, with or without edges
        for target, line in _imported_modules(path, package):
            if target != source:
                graph[source].setdefault(target, f"{path.relative_to(package.parent)}:{line}")
    return graph


@functools.cache
def _import_graph(package: Path = PACKAGE) -> dict[str, dict[str, str]]:
    """node -> {imported node: "file:line" of the first import that makes the edge}."""
    graph: dict[str, dict[str, str]] = defaultdict(dict)
    for module, targets in _module_graph(package).items():
        graph[_node(module)]  # every node appears, with or without edges
        for target, where in targets.items():
            if _node(target) != _node(module):
                graph[_node(module)].setdefault(_node(target), where)
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


def _private(name: str | None) -> bool:
    return bool(name) and name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _private_names_taken(package: Path = PACKAGE) -> list[str]:
    """``file:line takes module._name`` for every private name one module takes from another: imported by name
    (``from .run import _make_predictors``), or read off an imported module (``from . import run``, then
    ``run._make_predictors``)."""
    found = []
    for path in sorted(package.rglob("*.py")):
        own, where = _module_name(path, package), path.relative_to(package.parent)
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        modules: dict[str, str] = {}  # local name -> the module it is bound to
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for alias, module, taken in _aliases(node, _parent(path, package), package):
                    if taken is not None and _private(taken) and module != own:
                        found.append(f"{where}:{node.lineno} takes {module}.{taken}")
                    elif taken is None and (alias.asname or isinstance(node, ast.ImportFrom)):
                        modules[alias.asname or alias.name] = module
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and _private(node.attr):
                module = modules.get(node.value.id)
                if module is not None and module != own:
                    found.append(f"{where}:{node.lineno} takes {module}.{node.attr}")
    return sorted(set(found), key=lambda text: (text.split(":")[0], int(text.split(":")[1].split()[0])))


def _layer_rows(text: str) -> list[list[str]]:
    """The rows of the layer diagram in ``docs/architecture.md``, bottom first, each a list of graph nodes.

    A row starts with its entries (``pose/``, ``checkpoints.py``, ``__init__.py``) separated by spaces; the first
    word that is not an entry begins the description."""
    block = re.search(r"## Layers, bottom to top\s+```\n(.*?)```", text, re.S)
    assert block, "docs/architecture.md has no '## Layers, bottom to top' diagram"
    rows = []
    for line in block.group(1).splitlines():
        entries = []
        for word in line.split():
            match = re.fullmatch(r"([a-z_0-9]+)/|([a-z_0-9]+)\.py", word)
            if not match:
                break
            name = match.group(1) or match.group(2)
            entries.append(ROOT if name == "__init__" else f"{ROOT}.{name}")
        if entries:
            rows.append(entries)
    return rows[::-1]


# ------------------------------------------------------------------------------------------------------ the checker


def _write_package(folder: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)
    return folder / "pkg"


def test_the_checker_sees_lazy_and_type_checking_imports_and_private_names(tmp_path):
    """A tiny package with a lazy cycle between modules of one subpackage, a ``TYPE_CHECKING`` cycle between
    subpackages, and private names taken both ways: the checker reports each."""
    package = _write_package(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/a/__init__.py": "",
        "pkg/a/one.py": "def f():\n    from .two import g\n    return g\n",
        "pkg/a/two.py": "from pkg.a.one import f as g\nfrom pkg.b import helper\n",
        "pkg/b/__init__.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..a.two import g\n"
                             "def helper():\n    pass\n",
        "pkg/c.py": "from .a.one import _hidden\nfrom .a import one\nx = one._secret\nfrom . import __version__\n",
    })  # fmt: skip
    modules = _module_graph(package)
    assert "pkg.a.two" in modules["pkg.a.one"]  # inside a function
    assert _find_cycle(modules) in (["pkg.a.one", "pkg.a.two", "pkg.a.one"], ["pkg.a.two", "pkg.a.one", "pkg.a.two"])
    assert _find_cycle(_import_graph(package)) == ["pkg.a", "pkg.b", "pkg.a"]  # through ``TYPE_CHECKING``
    assert _private_names_taken(package) == ["pkg/c.py:1 takes pkg.a.one._hidden", "pkg/c.py:3 takes pkg.a.one._secret"]


def test_the_layer_diagram_parser_reads_entries_and_stops_at_the_description():
    text = (
        "## Layers, bottom to top\n\n```\ncli/   __main__.py    argparse -> options  (top)\n"
        "pose/  dense/   per-task pre/post-processing\n__init__.py  the public API\n"
        "tasks.py   the task table (bottom)\n```\n"
    )
    assert _layer_rows(text) == [
        ["sapiens2.tasks"],
        ["sapiens2"],
        ["sapiens2.pose", "sapiens2.dense"],
        ["sapiens2.cli", "sapiens2.__main__"],
    ]


# ----------------------------------------------------------------------------------------------------- the package


def test_relative_and_lazy_imports_are_found():
    graph = _import_graph()
    assert "sapiens2.checkpoints" in graph["sapiens2.pose"]  # a lazy ``from ..checkpoints import`` in a function
    assert "sapiens2.data" in graph["sapiens2.dense"]  # absolute imports
    assert {"sapiens2.models", "sapiens2.predict"} <= set(graph[ROOT])  # the public API re-exports


def _fail_on_cycle(graph: dict) -> None:
    cycle = _find_cycle(graph)
    if cycle is not None:
        steps = "\n".join(f"  {a} -> {b}  ({graph[a][b]})" for a, b in zip(cycle[:-1], cycle[1:], strict=True))
        pytest.fail(f"import cycle {' -> '.join(cycle)}:\n{steps}")


def test_subpackages_import_each_other_without_cycles():
    graph = _import_graph()
    _fail_on_cycle(graph)


def test_modules_import_each_other_without_cycles():
    """Also inside one subpackage (``pose.keypoints`` <-> ``pose.topdown`` was one, through ``TYPE_CHECKING``)."""
    graph = _module_graph()
    _fail_on_cycle(graph)


def test_no_module_takes_a_private_name_of_another():
    taken = _private_names_taken()
    assert not taken, "private names used across modules (give them a public name and one home):\n  " + "\n  ".join(
        taken
    )


def test_the_layer_diagram_of_the_architecture_page_matches_the_import_graph():
    """Every subpackage and top-level module sits on exactly one row of the diagram, and every import goes to a
    lower row: nothing imports a package on its own row or above."""
    rows = _layer_rows(ARCHITECTURE.read_text(encoding="utf-8"))
    row_of = {node: index for index, row in enumerate(rows) for node in row}
    listed = [node for row in rows for node in row]
    graph = _import_graph()
    assert len(listed) == len(set(listed)), f"listed twice: {sorted({n for n in listed if listed.count(n) > 1})}"
    assert set(listed) == set(graph), (
        f"missing from the diagram: {sorted(set(graph) - set(listed))}; "
        f"not in the package: {sorted(set(listed) - set(graph))}"
    )
    upward = [
        f"{source} -> {target} ({where})"
        for source, targets in graph.items()
        for target, where in targets.items()
        if row_of[target] >= row_of[source]
    ]
    assert not upward, "imports that do not go down the layer diagram of docs/architecture.md:\n  " + "\n  ".join(
        upward
    )


@pytest.mark.parametrize("leaf", LEAVES)
def test_bottom_layers_import_no_other_sapiens2_package(leaf):
    imports = {target: where for target, where in _import_graph()[leaf].items() if target not in FACTS or leaf in FACTS}
    assert not imports, f"{leaf} imports " + ", ".join(f"{target} ({where})" for target, where in imports.items())


def test_video_sits_above_predict():
    """``sapiens2.video`` takes Predictors (and builds them for ``sapiens2 predict`` through ``predict.batch``);
    ``predict`` knows nothing of video, not even lazily."""
    graph = _import_graph()
    assert "sapiens2.predict" in graph["sapiens2.video"]
    assert "sapiens2.video" not in graph["sapiens2.predict"], graph["sapiens2.predict"].get("sapiens2.video")


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
