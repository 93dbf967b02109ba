"""The README and the docs/ pages: every relative link resolves, every anchor
names a heading, and every `python -m` command they show exists.

Docs drift from code silently; a user who copies a command from them should
never meet "No module named ...".
"""

import importlib.util
import pathlib
import re

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), REPO / "benchmarks" / "README.md"]

# A markdown link [text](target), not an image's.
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
PYTHON_M = re.compile(r"\bpython3?(?:\.\d+)? -m ([A-Za-z_][\w.]*)")


def github_anchor(heading):
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to dashes."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors_of(page):
    anchors, fenced = set(), False
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and line.startswith("#"):
            anchors.add(github_anchor(line.lstrip("#")))
    return anchors


def links_of(page):
    return [m.group(1) for m in LINK.finditer(page.read_text())]


def module_exists(name):
    """A module of this repository (its file or package), else one the environment can import."""
    parts = name.split(".")
    path = REPO.joinpath(*parts)
    if path.with_suffix(".py").is_file() or (path / "__main__.py").is_file():
        return True
    if (REPO / parts[0]).is_dir() and (REPO / parts[0] / "__init__.py").is_file():
        return False  # one of ours, but no such module: a stale command
    return importlib.util.find_spec(parts[0]) is not None


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_resolves(page):
    broken = []
    for target in links_of(page):
        if re.match(r"[a-z]+:", target):
            continue  # https:, mailto:: not ours to check offline
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        if not resolved.exists():
            broken.append(f"{target}: no such file")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors_of(resolved):
            broken.append(f"{target}: no heading with that anchor")
    assert not broken, f"{page.relative_to(REPO)}: " + "; ".join(broken)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_python_m_command_exists(page):
    shown = {
        m for m in PYTHON_M.findall(page.read_text()) if not m.split(".")[-1].isupper()
    }  # not benchmarks.NAME
    missing = sorted(m for m in shown if not module_exists(m))
    assert not missing, f"{page.relative_to(REPO)} shows `python -m` for modules that do not exist: {missing}"


def test_the_readme_stays_a_front_page():
    assert len((REPO / "README.md").read_text().splitlines()) <= 250


def test_the_checks_catch_a_broken_link_and_a_stale_command(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# Title\n\n[gone](missing.md) [ok](#title) [bad](#nope)\n")
    assert links_of(page) == ["missing.md", "#title", "#nope"]
    assert "title" in anchors_of(page) and "nope" not in anchors_of(page)
    assert not module_exists("train.no_such_command")
    assert module_exists("train.tools.bench_input")
