"""The model's modules are used through their public names only, and import each other without cycles.

Search, scoring, training and the tests build on the model's public pieces (``encoder_step``,
``decoder_step``, ``output_features``, ``logits``, ...): a private method may then be renamed or
fused without breaking a caller it never mentions. Checked on the source (every file of the
project, tests and benchmarks included), so a new private call is caught where it is written.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
MODEL = ROOT / "rescorer" / "model"
SCANNED = ("rescorer", "tests", "benchmarks")


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _private_names(path: Path) -> tuple[set[str], set[str]]:
    """(private module-level names, private attribute names of its classes) of a model module."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    module_names, members = set(), set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and _private(node.name):
            module_names.add(node.name)
        elif isinstance(node, ast.Assign):
            module_names |= {t.id for t in node.targets if isinstance(t, ast.Name) and _private(t.id)}
        if isinstance(node, ast.ClassDef):
            members |= {m.name for m in node.body if isinstance(m, ast.FunctionDef) and _private(m.name)}
            for m in ast.walk(node):  # private attributes set on self
                if isinstance(m, ast.Attribute) and isinstance(m.value, ast.Name) and m.value.id == "self" \
                        and isinstance(m.ctx, ast.Store) and _private(m.attr):
                    members.add(m.attr)
    return module_names, members


def _model_modules() -> dict[str, Path]:
    return {p.stem: p for p in sorted(MODEL.glob("*.py")) if p.stem != "__init__"}


def test_no_file_reaches_a_private_name_of_another_model_module():
    private = {name: _private_names(path) for name, path in _model_modules().items()}
    all_members = {attr: name for name, (_, members) in private.items() for attr in members}
    wrong = []
    for path in sorted(p for d in SCANNED for p in (ROOT / d).rglob("*.py")):
        own = path.stem if path.parent == MODEL else None
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            where = f"{path.relative_to(ROOT)}:{getattr(node, 'lineno', 0)}"
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("rescorer.model."):
                module = node.module.split(".")[2]
                if module != own and module in private:
                    wrong += [f"{where} imports {module}.{a.name}" for a in node.names if a.name in private[module][0]]
            elif isinstance(node, ast.Attribute) and node.attr in all_members and all_members[node.attr] != own:
                wrong.append(f"{where} uses {all_members[node.attr]}'s private {node.attr}")
    assert not wrong, "\n".join(wrong)


def _model_imports(path: Path) -> set[str]:
    """The other model modules a model module imports, anywhere in it (TYPE_CHECKING blocks included)."""
    modules = _model_modules()
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module == "rescorer.model":
            found |= {a.name for a in node.names if a.name in modules}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("rescorer.model."):
            found.add(node.module.split(".")[2])
        elif isinstance(node, ast.Import):
            found |= {a.name.split(".")[2] for a in node.names if a.name.startswith("rescorer.model.")}
    return found - {path.stem}


def test_the_model_modules_import_each_other_without_a_cycle():
    graph = {name: _model_imports(path) for name, path in _model_modules().items()}
    done: set[str] = set()

    def visit(module: str, chain: list[str]) -> None:
        if module in chain:
            raise AssertionError("import cycle: " + " -> ".join(chain[chain.index(module):] + [module]))
        if module not in done:
            for imported in sorted(graph.get(module, ())):
                visit(imported, chain + [module])
            done.add(module)

    for module in graph:
        visit(module, [])


def test_only_the_model_builds_the_decoder_steps_arguments_from_its_layers():
    """The decoder step's arguments (h'⟨0⟩, the context terms, the input terms) are the model's
    ``decoder_init``/``decoder_context``/``decoder_inputs``: a search or scorer that sliced the
    layers itself would silently diverge when the parameter layout changes. The tests' reference
    equations read the layers on purpose, so only the code is scanned."""
    layers = {"dec_init", "dec_context", "dec_input", "dec_cand_bias"}
    wrong = []
    for path in sorted(p for d in ("rescorer", "benchmarks") for p in (ROOT / d).rglob("*.py")):
        if path == MODEL / "network.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Attribute) and node.attr in layers:
                wrong.append(f"{path.relative_to(ROOT)}:{node.lineno} reads the model's {node.attr}")
    assert not wrong, "\n".join(wrong)
