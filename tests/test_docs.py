"""The docs' cross-references, checked on the text: wherever the repository names a section of a page under
docs/ as `design.md "Parity gates"` (or `docs/measurement.md "Between launches"`, …), that page has a
heading of that name, so a reader who follows the reference finds it (docs/design.md "Invariants")."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
# where references are written: the code, its tests, the scripts and every page
SEARCHED = ("bench", "ddp_core", "tests", "docs", "scripts", "benchmarks", "examples")
SEARCHED_FILES = ("README.md", "Makefile")
# a page of docs/ and a quoted section name right after it: `design.md "Parity gates"`
REFERENCE = re.compile(r'\b([\w-]+)\.md "([^"\n]+)"')
HEADING = re.compile(r"^#{1,6} +(.+?) *$", re.MULTILINE)


# a paragraph's bold lead, `**Tests that time things.**`: the other pages' run-in section names
BOLD_LEAD = re.compile(r"^\*\*([^*\n]+?)\.?\*\*", re.MULTILINE)


def headings(page: Path, bold_leads: bool = False) -> list[str]:
    # a fenced block's `#` lines are code comments, not headings
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.MULTILINE | re.DOTALL)
    found = HEADING.findall(text) + (BOLD_LEAD.findall(text) if bold_leads else [])
    return [h.replace("`", "") for h in found]


def names_heading(name: str, titles: list[str]) -> bool:
    """`name` is a heading, or a heading's first words before its qualifier: "Parity gates" names
    "Parity gates (`bench/worker/parity.py`)", "Projection" names "Projection: `bench project`"."""
    return any(t == name or (t.startswith(name) and re.match(r"\s*[:(—,]", t[len(name):])) for t in titles)


def references() -> list[tuple[str, str, str]]:
    """(where, page, section) for every reference to a page of docs/ in the searched files."""
    files = [p for folder in SEARCHED for p in sorted((ROOT / folder).rglob("*"))
             if p.is_file() and p.suffix in (".py", ".md", ".toml", ".sh", "")]
    files += [ROOT / f for f in SEARCHED_FILES if (ROOT / f).is_file()]
    found = []
    for path in files:
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        for i, line in enumerate(text.splitlines(), 1):
            for page, section in REFERENCE.findall(line):
                if (DOCS / f"{page}.md").is_file():
                    found.append((f"{path.relative_to(ROOT)}:{i}", page, section))
    return found


def test_every_design_reference_names_a_heading():
    titles = headings(DOCS / "design.md")
    refs = [r for r in references() if r[1] == "design"]
    assert refs  # the code does refer to design.md's sections
    assert [f"{where}: {section!r}" for where, _, section in refs if not names_heading(section, titles)] == []


def test_every_reference_to_another_page_names_a_heading():
    pages = {p.stem: headings(p, bold_leads=True) for p in DOCS.glob("*.md")}
    bad = [f"{where}: {page}.md {section!r}" for where, page, section in references()
           if page != "design" and not names_heading(section, pages[page])]
    assert bad == []


def test_the_reference_reader_reads_references():
    assert REFERENCE.findall('see docs/design.md "Parity gates"; design.md "Run folder" and x.md "y"') == [
        ("design", "Parity gates"), ("design", "Run folder"), ("x", "y")]
    titles = ["Parity gates (`bench/worker/parity.py`)", "Projection: bench project", "Run folder"]
    assert names_heading("Parity gates", titles) and names_heading("Projection", titles)
    assert names_heading("Run folder", titles) and not names_heading("Run", titles)


def test_every_test_the_design_names_exists():
    # the invariants say which test holds each: a renamed or removed test would leave one unheld
    text = (DOCS / "design.md").read_text()
    defined = {name for path in (ROOT / "tests").glob("*.py")
               for name in re.findall(r"^def (test_\w+)", path.read_text(), re.MULTILINE)}
    named = set(re.findall(r"\b(test_\w+)\b", re.sub(r"tests/test_\w+\.py", "", text)))
    assert named and sorted(named - defined) == []
