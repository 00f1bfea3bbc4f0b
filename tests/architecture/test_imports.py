"""The package layering of docs/architecture.md, checked on every import the code makes.

A cycle hidden in a function-level import is still a cycle: a newcomer cannot read the packages
bottom-up, and a refactor of a lower package breaks a higher one it never mentions. So every
``import`` statement counts here, at module level or inside a function.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: Bottom to top: a package may import only from packages before it in this list.
LAYERS = ("moses_integration", "rescorer", "cslm", "mert", "table1")
#: Imports a package may make only inside a function (a reason each).
LAZY_ONLY = {("mert", "cslm"): "mert's CSLM n-best feature; MERT without a CSLM never loads torch"}


def _imports(path: Path) -> list[tuple[str, bool]]:
    """``(imported top-level package, at module level?)`` for each import statement of a file."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    top_level = {id(node) for node in tree.body}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name.split(".")[0], id(node) in top_level) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.module.split(".")[0], id(node) in top_level))
    return found


def test_every_package_of_the_project_is_in_the_layering():
    packages = {p.parent.name for p in ROOT.glob("*/__init__.py")} - {"tests", "benchmarks"}
    assert packages == set(LAYERS)


@pytest.mark.parametrize("package", LAYERS)
def test_a_package_imports_only_packages_below_it(package):
    allowed = set(LAYERS[: LAYERS.index(package)])
    wrong = []
    for path in sorted((ROOT / package).glob("*.py")):
        for imported, at_module_level in _imports(path):
            if imported not in LAYERS or imported == package:
                continue
            if imported not in allowed:
                wrong.append(f"{path.relative_to(ROOT)} imports {imported} (above or beside it)")
            elif at_module_level and (package, imported) in LAZY_ONLY:
                wrong.append(f"{path.relative_to(ROOT)} imports {imported} at module level: "
                             f"{LAZY_ONLY[package, imported]}")
    assert not wrong, "\n".join(wrong)


def test_moses_integration_never_imports_torch():
    """The formats and the CLI conventions load in a fraction of a second: ``--help`` stays instant."""
    heavy = [f"{path.name} imports {name}" for path in sorted((ROOT / "moses_integration").glob("*.py"))
             for name, _ in _imports(path) if name in {"torch", "triton"}]
    assert not heavy
