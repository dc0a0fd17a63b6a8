"""Packaging: every module the package imports is a declared dependency, and every asset ships with it."""

from __future__ import annotations

import ast
import fnmatch
import importlib.metadata
import re
import sys

from conftest import REPO

try:
    import tomllib
except ImportError:  # Python 3.10: pytest itself depends on tomli there
    import tomli as tomllib

PACKAGE = REPO / "sapiens2"
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
# Imported only for objects the caller already holds (a PIL image given to to_rgb_array), so never needed otherwise.
CALLER_PROVIDED = {"PIL"}


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _optional_lines(tree: ast.AST) -> set[int]:
    """Lines of imports inside a ``try`` that handles ImportError (optional features with a fallback)."""
    lines = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Try) and any(
            isinstance(h.type, ast.Name) and h.type.id in ("ImportError", "ModuleNotFoundError") for h in node.handlers
        ):
            lines |= {
                inner.lineno for statement in node.body for inner in ast.walk(statement) if hasattr(inner, "lineno")
            }
    return lines


def third_party_imports() -> dict[str, list[str]]:
    """Top-level module -> files importing it outside an ImportError guard (stdlib and sapiens2 excluded)."""
    found: dict[str, list[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text())
        optional = _optional_lines(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top in sys.stdlib_module_names or top == "sapiens2" or node.lineno in optional:
                    continue
                found.setdefault(top, []).append(str(path.relative_to(REPO)))
    return found


def test_every_imported_third_party_module_is_a_declared_dependency():
    requirements = PYPROJECT["project"]["dependencies"]
    declared = {_normalise(re.split(r"[<>=!~;\[ ]", spec, maxsplit=1)[0]) for spec in requirements}
    distributions = importlib.metadata.packages_distributions()
    imports = third_party_imports()
    assert {"torch", "yaml", "tqdm"} <= set(imports)  # the scan sees the package's imports
    missing = {}
    for module, files in imports.items():
        if module in CALLER_PROVIDED:
            continue
        names = {_normalise(d) for d in distributions.get(module, [module])}
        if not names & declared:
            missing[module] = sorted(set(files))
    assert not missing, f"imported but not in [project] dependencies: {missing}"


def test_every_asset_is_package_data():
    patterns = PYPROJECT["tool"]["setuptools"]["package-data"]["sapiens2"]
    assets = [p.relative_to(PACKAGE).as_posix() for p in (PACKAGE / "assets").iterdir() if p.is_file()]
    assert "assets/astronaut.jpg" in assets
    unshipped = [a for a in assets if not any(fnmatch.fnmatch(a, pattern) for pattern in patterns)]
    assert not unshipped, f"assets missing from [tool.setuptools.package-data]: {unshipped}"


def test_the_readme_names_the_core_and_tables_every_extra():
    """README's user install (``pip install sapiens2`` plus the extras one picks) names the core dependencies and has
    a row for every extra pyproject.toml declares, and for nothing else."""
    readme = (REPO / "README.md").read_text()
    setup = readme[readme.index("## Set-up") : readme.index("## Tests")]
    assert "\npip install sapiens2 " in setup
    core = [re.split(r"[<>=;\[ ]", requirement)[0] for requirement in PYPROJECT["project"]["dependencies"]]
    assert all(name in setup for name in core), [name for name in core if name not in setup]
    rows = re.findall(r"^\| `([a-z0-9_-]+)` \|", setup, re.M)
    assert sorted(rows) == sorted(PYPROJECT["project"]["optional-dependencies"]), rows
    tests = readme[readme.index("## Tests") :]
    assert 'pip install -e ".[dev]"' in tests and 'python -m pytest -q -m "not slow"' in tests
