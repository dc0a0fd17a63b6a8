"""What each optional extra of sapiens2 adds to an install: packages and megabytes on disk, beyond the core.

Reads the extras from pyproject.toml and walks each one's requirements through the distributions installed in this
environment (``importlib.metadata``: their ``Requires-Dist`` with extras and markers, and the file sizes their
``RECORD`` lists), so it needs an environment where the extras are installed (``pip install -e ".[dev]"``) and no
network. The core (torch and the other ``dependencies``) is measured once and left out of every extra's figure.
Prints a Markdown table; a requirement that is not installed here is named under it.

    python benchmarks/extras_weight.py
"""

from __future__ import annotations

import argparse
import re
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[1]


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def closure(requirements: list[str], missing: set[str]) -> set[str]:
    """The installed distributions ``requirements`` need, transitively (their extras and markers evaluated)."""
    seen: set[str] = set()
    todo = [(Requirement(text), "") for text in requirements]
    done_extras: set[tuple[str, str]] = set()
    while todo:
        requirement, extra = todo.pop()
        if requirement.marker is not None and not requirement.marker.evaluate({"extra": extra}):
            continue
        name = _canonical(requirement.name)
        try:
            dist = metadata.distribution(requirement.name)
        except metadata.PackageNotFoundError:
            missing.add(name)
            continue
        for wanted in ("", *sorted(requirement.extras)):
            if (name, wanted) in done_extras:
                continue
            done_extras.add((name, wanted))
            for text in dist.requires or []:
                todo.append((Requirement(text), wanted))
        seen.add(name)
    return seen


def installed_bytes(name: str) -> int:
    """Bytes on disk of one distribution's files (its RECORD sizes)."""
    files = metadata.distribution(name).files or []
    return sum(int(entry.size or 0) for entry in files)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pyproject", type=Path, default=REPO / "pyproject.toml")
    args = parser.parse_args()
    project = tomllib.loads(args.pyproject.read_text())["project"]
    missing: set[str] = set()
    core = closure(project["dependencies"], missing)
    mb = {name: installed_bytes(name) / 1e6 for name in core}
    print(f"core: {len(core)} packages, {sum(mb.values()):.0f} MB installed (torch {mb.get('torch', 0):.0f} MB)\n")
    print("| extra | packages beyond the core | MB installed | largest |")
    print("|---|---|---|---|")
    for extra, requirements in project["optional-dependencies"].items():
        added = closure(requirements, missing) - core
        sizes = sorted(((installed_bytes(name) / 1e6, name) for name in added), reverse=True)
        largest = ", ".join(f"{name} {size:.0f}" for size, name in sizes[:3])
        print(f"| {extra} | {len(added)} | {sum(size for size, _ in sizes):.0f} | {largest} |")
    if missing:
        print(f"\nnot installed here (left out): {', '.join(sorted(missing))}")


if __name__ == "__main__":
    main()
