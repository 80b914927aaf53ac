"""The README is a short front page and docs/ holds the references generated from the code;
these tests keep the tables true, the front page short and every relative link alive."""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import readme_tables  # noqa: E402

README_LIMIT = 8 * 1024
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def prose(page: Path) -> str:
    """The page without its fenced code blocks (a link there is code, not a link)."""
    return re.sub(r"^```.*?^```", "", page.read_text(), flags=re.S | re.M)


def relative_links(page: Path) -> list[str]:
    return [t for t in LINK.findall(prose(page)) if not re.match(r"[a-z]+:", t)]


def anchors(page: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces made dashes."""
    headings = re.findall(r"^#+ (.+)$", prose(page), flags=re.M)
    return {re.sub(r"[^a-z0-9 _-]", "", h.strip().lower()).replace(" ", "-") for h in headings}


def test_settings_table_matches_the_code() -> None:
    assert readme_tables.settings_table() in (ROOT / "docs/settings.md").read_text()


def test_exit_codes_table_matches_the_code() -> None:
    assert readme_tables.exit_codes_table() in (ROOT / "docs/errors.md").read_text()


def test_readme_starts_with_the_two_commands() -> None:
    text = (ROOT / "README.md").read_text()
    first_block = text.split("```sh", 1)[1].split("```", 1)[0]
    assert "scripts/demo" in first_block and ".ci/run" in first_block
    assert (ROOT / "scripts/demo").exists() and (ROOT / ".ci/run").exists()


def test_readme_is_a_front_page() -> None:
    assert len((ROOT / "README.md").read_bytes()) <= README_LIMIT


def test_every_relative_link_points_at_a_file() -> None:
    broken = [
        f"{page.relative_to(ROOT)}: {target}"
        for page in pages()
        for target in relative_links(page)
        if target.split("#", 1)[0] and not (page.parent / target.split("#", 1)[0]).exists()
    ]
    assert not broken


def test_every_link_to_a_heading_finds_it() -> None:
    broken = []
    for page in pages():
        for target in relative_links(page):
            path, _, anchor = target.partition("#")
            linked = (page.parent / path) if path else page
            if anchor and linked.suffix == ".md" and anchor not in anchors(linked):
                broken.append(f"{page.relative_to(ROOT)}: {target}")
    assert not broken
