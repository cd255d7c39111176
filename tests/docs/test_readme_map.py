"""The README stays short (issue 48: at most 150 lines) and is a map: it links every page of the docs."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# Pages that only include a file the README links itself (the changelog) are not pages of their own to link.
INCLUDES_ONLY = {"docs/changelog.md"}


def test_the_readme_is_at_most_150_lines() -> None:
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 150, f"README.md has {len(lines)} lines: move the detail into a docs page and link it"


def test_the_readme_links_every_docs_page() -> None:
    linked = {
        (ROOT / target.partition("#")[0]).resolve()
        for target in re.findall(r"\]\(([^)\s]+)\)", (ROOT / "README.md").read_text())
        if not re.match(r"^[a-z][a-z0-9+.-]*:", target)
    }
    pages = {
        p.resolve()
        for p in (ROOT / "docs").rglob("*")
        if p.suffix in {".md", ".rst"}
        and "_build" not in p.parts
        and p != ROOT / "docs" / "index.md"  # the site's own front page: the README is the repository's
        and str(p.relative_to(ROOT)) not in INCLUDES_ONLY
    }
    missing = sorted(str(p.relative_to(ROOT)) for p in pages - linked)
    assert missing == [], f"docs pages the README's map does not link: {missing}"
