"""The docs' links hold: every relative link in README, CONTRIBUTING and docs/ names a file
that exists, and its #anchor a heading of that file (GitHub's slugs); every docs/ page that
the code, recipes, params or Makefile name exists, with the section they quote by title."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from helpers import REPO

PAGES = [REPO / "README.md", REPO / "CONTRIBUTING.md", *sorted((REPO / "docs").glob("*.md"))]
CODE = [*sorted((REPO / "pipeline").rglob("*.py")), *sorted((REPO / "recipes").glob("*.yaml")),
        REPO / "params.yaml", REPO / "Makefile"]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def headings(text: str) -> list[str]:
    """The headings of a Markdown text outside code fences, as written (without the #s)."""
    return [m.group(1).strip() for m in re.finditer(r"^#{1,6}\s+(.+?)\s*#*$", FENCE.sub("", text), re.M)]


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, markup and punctuation dropped (word
    characters, spaces and hyphens kept), each space a hyphen."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every anchor of a page; a repeated heading's later anchors get -1, -2, ... as on GitHub."""
    seen: dict[str, int] = {}
    out = set()
    for h in headings(path.read_text()):
        base = slug(h)
        n = seen.get(base, 0)
        out.add(base if n == 0 else f"{base}-{n}")
        seen[base] = n + 1
    return out


def broken_links(page: Path) -> list[str]:
    """'target: why' for each relative link of a page whose file or anchor is missing."""
    bad = []
    for target in LINK.findall(FENCE.sub("", page.read_text())):
        if re.match(r"[a-z]+:", target):
            continue  # http(s), mailto: not checked (no network)
        file, _, anchor = target.partition("#")
        path = (page.parent / file).resolve() if file else page
        if not path.exists():
            bad.append(f"{target}: no such file")
        elif anchor and path.suffix == ".md" and anchor not in anchors(path):
            bad.append(f"{target}: no such heading in {path.name}")
    return bad


def test_slugs_follow_github():
    assert slug("The fast recipe (`recipes/fast.yaml`)") == "the-fast-recipe-recipesfastyaml"
    assert slug("`pipeline show` — contact sheets") == "pipeline-show--contact-sheets"
    assert slug("Run log 2: pixel origin, SGD lr 0.8, 96 px") == "run-log-2-pixel-origin-sgd-lr-08-96-px"
    assert slug("channels_last and the weights' EMA") == "channels_last-and-the-weights-ema"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(REPO).as_posix())
def test_relative_links_and_anchors_resolve(page):
    assert broken_links(page) == []


def quoted_doc_references(path: Path) -> list[tuple[str, str]]:
    """(page, section title or '') for each `docs/X.md` a file names, with the title when a
    quoted one follows (`docs/X.md, "Title"`); comment markers between lines are dropped."""
    text = re.sub(r"\n\s*(#\s?)?", " ", path.read_text())
    return re.findall(r"docs/([\w.-]+\.md)(?:,\s*[\"']([^\"']+)[\"'])?", text)


@pytest.mark.parametrize("path", CODE, ids=lambda p: p.relative_to(REPO).as_posix())
def test_docs_named_in_code_exist_with_their_quoted_sections(path):
    bad = []
    for page, title in quoted_doc_references(path):
        doc = REPO / "docs" / page
        if not doc.exists():
            bad.append(f"docs/{page}: no such file")
        elif title and not any(h.replace("`", "").lower().startswith(title.replace("`", "").lower())
                               for h in headings(doc.read_text())):
            bad.append(f'docs/{page}, "{title}": no heading starts so')
    assert bad == []
