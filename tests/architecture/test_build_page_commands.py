"""The build pages' shell lines that can run offline run as typed: docker/README.md's Moses-image snippet
and docs/moses-nplm.md's Eigen link.

Those pages are followed once, on a fresh machine, by someone who pastes them; a line that misbehaves
there does so silently (an unset variable made ``find -L "$X"/bin`` copy the host's ``/bin``; a second
``ln -s`` wrote a link inside Debian's Eigen). The lines are read from the pages themselves and run in
scratch folders, with any path outside them substituted.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
IMAGE_PAGE = ROOT / "docker" / "README.md"
MOSES_PAGE = ROOT / "docs" / "moses-nplm.md"


def _code_blocks(page: Path) -> list[str]:
    return re.findall(r"```[^\n]*\n(.*?)```", page.read_text(encoding="utf-8"), flags=re.S)


def _block(page: Path, marker: str) -> str:
    """The one code block of the page that holds marker."""
    blocks = [block for block in _code_blocks(page) if marker in block]
    assert len(blocks) == 1, f"{page.relative_to(ROOT)}: {len(blocks)} code blocks hold {marker!r}"
    return blocks[0]


def _bash(script: str, cwd: Path, tmp_path: Path, **variables: str) -> subprocess.CompletedProcess[str]:
    """script run by a non-interactive bash, as a pasted block runs from a file, without $MOSES_DIR
    or $MOSES_HOME; a ``podman`` first on PATH fails, so that nothing reaches a real image store."""
    stub = tmp_path / "stub-bin"
    if not stub.is_dir():
        stub.mkdir()
        (stub / "podman").write_text("#!/bin/sh\necho 'podman: not in a test' >&2\nexit 1\n")
        (stub / "podman").chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in {"MOSES_DIR", "MOSES_HOME"}}
    env.update(variables, PATH=f"{stub}{os.pathsep}{os.environ['PATH']}")
    return subprocess.run(["bash", "-c", script], cwd=cwd, env=env, capture_output=True, text=True, timeout=60)


def test_the_moses_image_snippet_refuses_an_unset_moses_dir(tmp_path: Path) -> None:
    """The snippet reads the variable docs/moses-nplm.md sets, and without it stops before it creates
    anything; each line that reads it refuses on its own too, as when pasted into an interactive shell
    (where a failed line does not stop the next one): ``find`` never reads the host's ``/bin``."""
    block = _block(IMAGE_PAGE, "podman import - localhost/moses-nplm")
    assert re.search(r"^MOSES_DIR=", "".join(_code_blocks(MOSES_PAGE)), flags=re.M), "the Moses page sets no MOSES_DIR"
    assert "MOSES_HOME" not in block, "the snippet reads MOSES_HOME, which docs/moses-nplm.md never sets"
    unguarded = re.findall(r"\$MOSES_DIR\b|\$\{MOSES_DIR(?!:\?)", block)
    assert not unguarded, f"the snippet reads MOSES_DIR without ${{MOSES_DIR:?…}}: {unguarded}"
    message = re.search(r"\$\{MOSES_DIR:\?([^}]+)\}", block)
    assert message, "no ${MOSES_DIR:?message} in the snippet"

    scratch = tmp_path / "scratch"
    scratch.mkdir()
    result = _bash(block, scratch, tmp_path)
    assert result.returncode != 0 and message.group(1) in result.stderr, result.stderr
    assert not list(scratch.iterdir()), "the snippet created files before it refused"

    lines = [line for line in re.sub(r"\\\n", " ", block).splitlines() if "MOSES_DIR" in line.split("#")[0]]
    assert len(lines) >= 2  # the check and the lines that read the tree
    target = scratch / "moses-root" / "opt" / "bin" / "moses"
    (target / "bin").mkdir(parents=True)  # as when the mkdir line ran after a refused check
    for line in lines:
        result = _bash(line, scratch, tmp_path)
        assert result.returncode != 0 and "MOSES_DIR" in result.stderr, f"{line}\n{result.stderr}"
    assert [p.name for p in target.iterdir()] == ["bin"] and not list((target / "bin").iterdir())


def test_the_eigen_link_can_be_made_again(tmp_path: Path) -> None:
    """Step 4 run a second time (the page expects a new shell to repeat steps) replaces the link to
    Eigen and writes nothing inside Eigen's folder; Debian's /usr/include/eigen3 becomes a scratch folder."""
    block = _block(MOSES_PAGE, "libnplm.a EIGEN=")
    links = [line for line in block.splitlines() if line.startswith("ln ")]
    assert len(links) == 1, links
    eigen = tmp_path / "include" / "eigen3"
    (eigen / "Eigen").mkdir(parents=True)
    nplm = tmp_path / "nplm"
    (nplm / "3rdparty").mkdir(parents=True)
    line = links[0].replace("/usr/include/eigen3", shlex.quote(str(eigen)))
    assert line != links[0], f"the link's target is not Debian's Eigen: {links[0]}"
    for run in (1, 2):
        result = _bash(line, tmp_path, tmp_path, NPLM_DIR=str(nplm))
        assert result.returncode == 0, f"run {run}: {line}\n{result.stderr}"
    link = nplm / "3rdparty" / "eigen"
    assert link.is_symlink() and link.resolve() == eigen.resolve()
    assert [p.name for p in eigen.iterdir()] == ["Eigen"], "the second run wrote inside Eigen's folder"


def test_the_image_pages_scratch_roots_stay_out_of_the_build_context_git_and_ruff() -> None:
    """The roots the image page imports (``tar -C ROOT -c . | podman import``) belong in a scratch folder;
    made in the clone by mistake, they would join the build context (hundreds of MB), show in git, and
    fail ``make test``'s ``ruff check .`` on Moses' scripts."""
    roots = set(re.findall(r"tar -C (\S+) -c \.", "".join(_code_blocks(IMAGE_PAGE))))
    assert roots == {"debian-root", "moses-root"}, roots

    def names(path: Path) -> set[str]:
        return {line.strip().strip("/") for line in path.read_text().splitlines() if not line.startswith("#")}

    exclude = re.search(r"^extend-exclude = \[(.*?)\]", (ROOT / "pyproject.toml").read_text(), flags=re.M)
    assert exclude, "no extend-exclude in pyproject.toml's [tool.ruff]"
    for where, ignored in ((".dockerignore", names(ROOT / ".dockerignore")),
                           (".gitignore", names(ROOT / ".gitignore")),
                           ("ruff's extend-exclude", set(re.findall(r'"([^"]+)"', exclude.group(1))))):
        assert roots <= ignored, f"{where} lacks {sorted(roots - ignored)}"
