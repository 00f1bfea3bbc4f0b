"""README is the map: every page it and the docs point to exists, every anchor names a heading there,
and every page of docs/ is reachable from README. A section moved or renamed without its links
fails here, not in a reader's browser.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", ROOT / "docker" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _prose(page: Path) -> str:
    """The page without its code blocks: a '#' or '+' line in code is neither a heading nor a list."""
    return re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)


def _anchors(page: Path) -> set[str]:
    return {_slug(m.group(1)) for m in re.finditer(r"^#{1,6} (.+)$", _prose(page), flags=re.M)}


def _links(page: Path) -> list[str]:
    return [t for t in LINK.findall(page.read_text(encoding="utf-8")) if not re.match(r"[a-z]+:", t)]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_link_reaches_a_file_and_every_anchor_a_heading(page: Path) -> None:
    wrong = []
    for target in _links(page):
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            wrong.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            wrong.append(f"{target}: no heading with that anchor in {dest.relative_to(ROOT)}")
    assert not wrong, f"{page.relative_to(ROOT)}:\n" + "\n".join(wrong)


def test_readme_points_to_every_page_of_docs() -> None:
    linked = {(ROOT / t.partition("#")[0]).resolve() for t in _links(ROOT / "README.md")}
    unlinked = [p.name for p in sorted((ROOT / "docs").glob("*.md")) if p.resolve() not in linked]
    assert not unlinked, f"docs pages README does not point to: {unlinked}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_wrapped_line_starts_with_a_plus(page: Path) -> None:
    """The rows are named "+ RNN", "+ CSLM": wrapped onto a line of its own, such a name starts a
    list item in Markdown and breaks the sentence. The pages use no '+' lists on purpose."""
    starts = [line for line in _prose(page).splitlines() if re.match(r"\s*\+ ", line)]
    assert not starts, f"{page.relative_to(ROOT)}: lines Markdown reads as list items: {starts}"


def test_readme_stays_a_map_of_at_most_20_kb() -> None:
    """README points to the pages that hold the tables; results and benchmark tables grow there."""
    size = len((ROOT / "README.md").read_bytes())
    assert size <= 20 * 1024, f"README.md is {size} bytes: move a section's detail to its docs page"
