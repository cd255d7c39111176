"""Check the local links of the README, the changelog, the docs' Markdown pages and the READMEs they include:
each relative link must name a file that exists and, for a Markdown file, a heading that exists (GitHub's anchor
for it). External links (http, https, mailto) are not followed: CI may have no internet.

``python docs/_ext/local_links.py`` prints each broken link and exits 1 if there is one (``make docs`` runs it).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LINK = re.compile(r"(?<!!)\[[^\]\n]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def markdown_files() -> list[Path]:
    files = [ROOT / "README.md", ROOT / "CHANGELOG.md", ROOT / "workloads" / "README.md", ROOT / "bench" / "README.md"]
    files += sorted(p for p in (ROOT / "docs").rglob("*.md") if "_build" not in p.parts)
    return [p for p in files if p.exists()]


def _prose(text: str) -> list[tuple[int, str]]:
    """(line number, line) outside fenced code blocks, with inline code blanked."""
    out, fence = [], False
    for number, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith(("```", "~~~")):
            fence = not fence
            continue
        if not fence:
            out.append((number, re.sub(r"`[^`]*`", "``", line)))
    return out


def anchor(heading: str) -> str:
    """GitHub's (and MyST's) anchor of a heading: lowercase, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"`([^`]*)`", r"\1", heading).strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    found: set[str] = set()
    for _, line in _prose(path.read_text()):
        match = HEADING.match(line)
        if match:
            found.add(anchor(match.group(2)))
    return found


def _shown(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def broken_links(files: list[Path] | None = None) -> list[str]:
    problems = []
    for path in files or markdown_files():
        for number, line in _prose(path.read_text()):
            for target in LINK.findall(line):
                if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:, ...
                    continue
                file_part, _, fragment = target.partition("#")
                dest = (path.parent / file_part).resolve() if file_part else path
                where = f"{_shown(path)}:{number}: {target}"
                if not dest.exists():
                    problems.append(f"{where}: no such file")
                elif fragment and dest.suffix == ".md" and fragment not in anchors(dest):
                    problems.append(f"{where}: no heading #{fragment} in {_shown(dest)}")
    return problems


if __name__ == "__main__":
    broken = broken_links()
    for problem in broken:
        print(problem)
    print(f"local links: {len(broken)} broken in {len(markdown_files())} Markdown files")
    sys.exit(1 if broken else 0)
