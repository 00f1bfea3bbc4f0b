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
#: What each package may import: the packages below it in docs/architecture.md's picture. ``cslm``,
#: ``rescorer`` and ``nmt`` stand side by side on ``neural``, none importing another; ``mert`` knows no
#: model (it finds the CSLM's and the NMT model's n-best features through the entry point);
#: ``table1`` runs the networks as commands, and reads a training's state through ``rescorer.model``
#: (:func:`test_the_experiment_uses_only_the_rescorer_model`).
BELOW = {
    "infrastructure": set(),
    "moses_integration": {"infrastructure"},
    "neural": {"moses_integration", "infrastructure"},
    "cslm": {"neural", "moses_integration", "infrastructure"},
    "rescorer": {"neural", "moses_integration", "infrastructure"},
    "nmt": {"neural", "moses_integration", "infrastructure"},
    "mert": {"moses_integration", "infrastructure"},
    "table1": {"mert", "rescorer", "neural", "moses_integration", "infrastructure"},
}
LAYERS = tuple(BELOW)
#: Packages that know no model package, and so never load torch: what every command shares (files, CLI
#: conventions, threads, errors, progress, interrupts, processes), the formats, and MERT, whose extra
#: n-best features come from above (a package registers one; the CSLM is registered in pyproject.toml).
MODEL_FREE = ("infrastructure", "moses_integration", "mert")
MODEL_PACKAGES = {"neural", "rescorer", "cslm", "nmt", "torch", "triton"}
#: Bottom to top inside ``rescorer``: one subpackage per job; ``cli.py`` and ``nbest.py`` (the n-best
#: feature MERT loads through the entry point) sit above them all.
RESCORER_LAYERS = ("tables", "model", "training", "pipeline", "proposals", "analysis")


def _imports(path: Path, depth: int = 1) -> list[tuple[str, bool]]:
    """``(imported package, at module level?)`` for each import statement of a file, the package's
    dotted name cut to ``depth`` parts (1: ``rescorer``, 2: ``rescorer.model``)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    top_level = {id(node) for node in tree.body}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(".".join(alias.name.split(".")[:depth]), id(node) in top_level) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((".".join(node.module.split(".")[:depth]), id(node) in top_level))
    return found


def test_every_package_of_the_project_is_in_the_layering():
    packages = {p.parent.name for p in ROOT.glob("*/__init__.py")} - {"tests", "benchmarks"}
    assert packages == set(LAYERS)


@pytest.mark.parametrize("package", LAYERS)
def test_a_package_imports_only_packages_below_it(package):
    allowed = BELOW[package]
    wrong = []
    for path in sorted((ROOT / package).rglob("*.py")):
        for imported, _ in _imports(path):
            if imported in LAYERS and imported != package and imported not in allowed:
                wrong.append(f"{path.relative_to(ROOT)} imports {imported} (above or beside it)")
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("package", MODEL_FREE)
def test_formats_and_mert_import_no_model_package_and_never_torch(package):
    """The formats and the CLI conventions load in a fraction of a second (``--help`` stays instant),
    and MERT tunes any system without knowing a model: no import of one, even inside a function."""
    wrong = [f"{path.relative_to(ROOT)} imports {name}" for path in sorted((ROOT / package).rglob("*.py"))
             for name, _ in _imports(path) if name in MODEL_PACKAGES]
    assert not wrong, "\n".join(wrong)


def test_rescorer_subpackages_import_only_those_below_them():
    """``rescorer`` holds five jobs around its tables reader; each subpackage imports only the ones
    before it in ``RESCORER_LAYERS``, and never ``rescorer.cli``."""
    subpackages = {p.parent.name for p in (ROOT / "rescorer").glob("*/__init__.py")}
    assert subpackages == set(RESCORER_LAYERS)
    assert {p.name for p in (ROOT / "rescorer").glob("*.py")} == {"__init__.py", "cli.py", "nbest.py"}
    wrong = []
    for sub in RESCORER_LAYERS:
        allowed = {f"rescorer.{s}" for s in RESCORER_LAYERS[: RESCORER_LAYERS.index(sub) + 1]}
        for path in sorted((ROOT / "rescorer" / sub).rglob("*.py")):
            for imported, _ in _imports(path, depth=2):
                if imported.startswith("rescorer") and imported not in allowed:
                    wrong.append(f"{path.relative_to(ROOT)} imports {imported} (above or beside it)")
    assert not wrong, "\n".join(wrong)


def test_the_cslm_imports_nothing_of_the_rnn():
    """The CSLM shares with the RNN only what ``neural`` holds (devices, CUDA graphs, vocabularies,
    config records, the model-file envelope): loading it loads no RNN module, no Triton kernel."""
    wrong = [f"{path.relative_to(ROOT)} imports {imported}" for path in sorted((ROOT / "cslm").rglob("*.py"))
             for imported, _ in _imports(path) if imported == "rescorer"]
    assert not wrong, "\n".join(wrong)


def test_the_nmt_model_imports_neither_the_rnn_nor_the_cslm():
    """The attention encoder-decoder shares with the other networks only what ``neural`` holds: loading it
    loads no RNN or CSLM module (and no Triton kernel)."""
    wrong = [f"{path.relative_to(ROOT)} imports {imported}" for path in sorted((ROOT / "nmt").rglob("*.py"))
             for imported, _ in _imports(path) if imported in ("rescorer", "cslm")]
    assert not wrong, "\n".join(wrong)


def test_the_experiment_uses_only_the_rescorer_model():
    """The experiment shares the model's checkpoint, nothing of the pipeline's, the training's or the
    analysis' internals (table1 runs the commands)."""
    wrong = [f"{path.relative_to(ROOT)} imports {imported}"
             for path in sorted((ROOT / "table1").rglob("*.py"))
             for imported, _ in _imports(path, depth=2)
             if imported.startswith("rescorer") and imported != "rescorer.model"]
    assert not wrong, "\n".join(wrong)
