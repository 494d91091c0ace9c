"""The documentation's links stay inside the repository and point at something (issue 30 item
11): every markdown link of README.md and docs/ is a relative path to a file or folder of this
checkout, and a ``#anchor`` names a heading of the page it points to. Decision records may also
cite outside sources by URL (what they were decided from); no other page links outside.
Links in code blocks and inline code are text, not links.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
_LINK = re.compile(r"(?<!!)\[(?:[^\]\[]|\[[^\]]*\])*\]\(([^)\s]+)\)")
_FENCE = re.compile(r"^\s*```.*?^\s*```", re.MULTILINE | re.DOTALL)
_CODE = re.compile(r"`[^`\n]*`")


def links(text: str) -> list[str]:
    """The targets of the markdown links in ``text``, outside code."""
    return _LINK.findall(_CODE.sub("", _FENCE.sub("", text)))


def anchors(text: str) -> set[str]:
    """GitHub's heading anchors of a page: lower case, punctuation but ``-`` and ``_`` dropped,
    spaces to ``-``; a repeated heading gets ``-1``, ``-2``..."""
    found: set[str] = set()
    for line in _FENCE.sub("", text).splitlines():
        m = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        base = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
        slug, n = base, 0
        while slug in found:
            n += 1
            slug = f"{base}-{n}"
        found.add(slug)
    return found


def check_link(page: Path, target: str) -> str | None:
    """Why ``target``, a link on ``page``, is broken (None when it is fine)."""
    if re.match(r"[a-z][a-z0-9+.-]*:", target):
        if page.parent.name == "decisions" and target.startswith("https://"):
            return None  # a record citing its source
        return "leaves the repository (an absolute URL)"
    path, _, anchor = target.partition("#")
    dest = (page.parent / path).resolve() if path else page
    if ROOT not in dest.parents and dest != ROOT:
        return "leaves the repository"
    if not dest.exists():
        return f"{dest.relative_to(ROOT)} does not exist"
    if anchor and dest.suffix == ".md" and anchor not in anchors(dest.read_text()):
        return f"no heading #{anchor} in {dest.relative_to(ROOT)}"
    return None


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_links_resolve_inside_the_repository(page):
    broken = [(t, why) for t in links(page.read_text()) if (why := check_link(page, t))]
    assert not broken, "\n".join(f"{page.relative_to(ROOT)}: ({t}) {why}" for t, why in broken)


def test_the_readme_links_the_documentation():
    text = (ROOT / "README.md").read_text()
    for page in ("getting-started", "why-kiln", "targets", "api", "cli", "changelog",
                 "reporting-problems"):
        assert f"(docs/{page}.md" in text, page


def test_the_checker_sees_broken_links(tmp_path, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    (tmp_path / "a.md").write_text("# Title\n\n## Two words\n\n```sh\n# not a heading\n```\n")
    page = tmp_path / "b.md"
    assert links("[x](a.md) `[y](no.md)`\n```\n[z](no.md)\n```\n![img](i.png)") == ["a.md"]
    assert check_link(page, "a.md#two-words") is None
    assert check_link(page, "a.md#title") is None
    assert "no heading" in check_link(page, "a.md#not-a-heading")
    assert "does not exist" in check_link(page, "missing.md")
    assert "leaves" in check_link(page, "../outside.md")
    assert "absolute URL" in check_link(page, "https://example.org/x")
    (tmp_path / "decisions").mkdir()
    assert check_link(tmp_path / "decisions" / "001.md", "https://example.org/x") is None
    assert anchors("## A\n## A\n## kiln.runtime.load_module\n") == {
        "a", "a-1", "kilnruntimeload_module"}
