"""The README and docs/ pages: every relative link points at a file that exists, and every
``#anchor`` at a heading of that page (GitHub's slug rules), so the split into one page per topic
cannot leave a dangling link behind."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to dashes."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    found: set[str] = set()
    fenced = False
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and re.match(r"#+ ", line):
            found.add(slug(line.lstrip("#")))
    return found


def links(page: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)  # links in code blocks are code
    return [m.group(1) for m in LINK.finditer(text)]


def test_every_docs_page_is_listed_in_the_index():
    index = (ROOT / "docs" / "README.md").read_text()
    missing = [p.name for p in PAGES[1:] if p.name != "README.md" and f"]({p.name})" not in index]
    assert not missing, f"docs/README.md does not link: {missing}"


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_relative_links_resolve(page: Path):
    bad = []
    for target in links(page):
        if re.match(r"[a-z]+:", target):
            continue  # https:, mailto:
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if path.startswith("../../shared/") or path.startswith("../shared/"):
            continue  # the project's shared folder lives beside the repository, not in it
        if not dest.exists():
            bad.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            bad.append(f"{target}: no heading #{anchor}")
    assert not bad, f"{page.name}: " + "; ".join(bad)


def test_every_flag_of_every_sub_command_is_documented():
    """The real parsers are the source of truth: a flag added without a line in docs/ fails here."""
    from kcms.cmd.main import COMMANDS, build_parser

    docs = "".join(p.read_text() for p in PAGES)
    missing = []
    for command in COMMANDS:
        parser = build_parser(command)
        sub = parser._subparsers._group_actions[0].choices[command]  # type: ignore[union-attr]
        for action in sub._actions:
            missing += [
                f"kcms {command} {flag}"
                for flag in action.option_strings
                if flag.startswith("--") and flag != "--help" and f"`{flag}" not in docs
            ]
    assert not missing, f"flags with no mention in README.md or docs/: {missing}"
