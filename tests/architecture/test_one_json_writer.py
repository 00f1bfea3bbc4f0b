"""Every JSON file of the project is written by ``infrastructure.files.write_json``: atomically (a kill
mid-write keeps the old file, which a resumed run or a later step reads) and in one format. A copy of the
writer elsewhere drifts (one forgot the fsync, one wrote in place), so the code is checked for them."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
THE_WRITER = Path("infrastructure/files.py")
#: Calls that put a string or bytes into a file.
FILE_WRITES = {"write", "write_text", "write_bytes", "atomic_write_bytes"}


def _code_files() -> list[Path]:
    """The project's modules: every package beside ``tests/`` (not the tests, which write their inputs)."""
    packages = [p for p in ROOT.iterdir() if (p / "__init__.py").is_file() and p.name != "tests"]
    return sorted(path for package in packages for path in package.rglob("*.py"))


def _name(func: ast.expr) -> str:
    """``json.dump`` for ``json.dump(...)``, ``write_text`` for ``x.y.write_text(...)``."""
    if isinstance(func, ast.Attribute):
        return f"json.{func.attr}" if isinstance(func.value, ast.Name) and func.value.id == "json" else func.attr
    return func.id if isinstance(func, ast.Name) else ""


def _json_written_to_a_file(path: Path, root: Path = ROOT) -> list[str]:
    """``file:line`` (from ``root``) of each ``json.dump(``, and of each ``json.dumps(`` inside a call
    that writes a file."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not isinstance(node, ast.Call):
            continue
        name = _name(node.func)
        inner = [n for arg in [*node.args, *(k.value for k in node.keywords)] for n in ast.walk(arg)]
        if name == "json.dump" or (name in FILE_WRITES and any(
                isinstance(n, ast.Call) and _name(n.func) == "json.dumps" for n in inner)):
            found.append(f"{path.relative_to(root)}:{node.lineno}")
    return found


def test_the_scan_sees_the_project_and_a_copy_of_the_writer(tmp_path: Path) -> None:
    modules = {path.relative_to(ROOT) for path in _code_files()}
    assert THE_WRITER in modules and Path("table1/workspace.py") in modules and len(modules) > 100
    copy = tmp_path / "a_copy.py"
    copy.write_text("import json\ndef save(path, doc, fh):\n    path.write_text(json.dumps(doc))\n"
                    "    fh.write((json.dumps(doc, indent=1) + '\\n').encode())\n    json.dump(doc, fh)\n"
                    "    print(json.dumps(doc))\n", encoding="utf-8")
    assert _json_written_to_a_file(copy, tmp_path) == [f"a_copy.py:{n}" for n in (3, 4, 5)]


def test_no_module_but_the_one_writer_writes_json_to_a_file() -> None:
    found = [hit for path in _code_files() if path.relative_to(ROOT) != THE_WRITER
             for hit in _json_written_to_a_file(path)]
    assert found == [], "write JSON files with infrastructure.files.write_json"
