"""The docs site builds without a warning and every ``bench`` command line it shows is real.

The README and docs/ are the manual users copy commands from: a renamed flag or command must
fail here, not in a user's nightly job."""

from __future__ import annotations

import html
import re
import shlex
import subprocess
import sys
from pathlib import Path

import click
import pytest

from suite.cli import main

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]

_FENCED = re.compile(r"```(?:bash|console|sh)?\n(.*?)```", re.S)
_INLINE = re.compile(r"`(bench [^`]+)`")


def _command_lines(text: str) -> list[str]:
    """``bench ...`` lines of shell blocks and inline code spans (comments dropped)."""
    lines = []
    for block in _FENCED.findall(text):
        for line in block.splitlines():
            line = line.split(" #", 1)[0].strip().removeprefix("$ ")
            if line.startswith("bench "):
                lines.append(line)
    lines += _INLINE.findall(text)
    return lines


def _flags(command: click.Command, ctx: click.Context) -> set[str]:
    return {flag for param in command.get_params(ctx) for flag in param.opts + param.secondary_opts}


#: Sphinx markup that mkdocstrings shows raw: a role (``:class:`X```) or a literal block
#: header (``Example::``); the docs' own style is Google sections and Markdown
SPHINX_ROLE = re.compile(r":(?:py:)?(?:class|func|meth|mod|attr|data|exc|obj):`")
RAW_IN_HTML = re.compile(r":(?:class|func|meth|mod|attr|data|exc|obj):\s*\w|\bExamples?::")
DOCUMENTED = ("suite", "methods", "baselines", "workloads", "tests/plugin_example")


def page_text(path: Path) -> str:
    """An HTML page's text as a reader sees it (tags and code spans' markup removed)."""
    return html.unescape(re.sub(r"<[^>]+>", "", path.read_text()))


def test_docs_site_builds_strictly(tmp_path):
    """mkdocs --strict: a broken link, a missing snippet or an API docstring griffe cannot
    parse is an error; and no page shows Sphinx markup raw (a role, an ``Example::``), the
    API page's examples are highlighted code and its introduction is said once."""
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(tmp_path / "site")],
        cwd=ROOT, capture_output=True, text=True,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    api = tmp_path / "site" / "api" / "index.html"
    raw = {str(page.relative_to(tmp_path)): sorted(set(RAW_IN_HTML.findall(page_text(page))))
           for page in (tmp_path / "site").rglob("*.html")}
    assert not {page: found for page, found in raw.items() if found}
    text = api.read_text()
    assert text.count('doc-section-title">Examples:') >= 20  # the members' examples, as code
    assert '<div class="highlight"><pre><span></span><code><span class="n">mean' in text
    assert page_text(api).count("stable across releases") == 1


def test_docstrings_use_no_sphinx_roles():
    """The source the API page and a reader's editor show: Google sections and Markdown."""
    found = [f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
             for folder in DOCUMENTED for path in sorted((ROOT / folder).rglob("*.py"))
             for number, line in enumerate(path.read_text().splitlines(), 1)
             if SPHINX_ROLE.search(line) or re.search(r"\bExamples?::\s*$", line)]
    assert not found, "\n".join(found)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_bench_command_shown_exists(page):
    ctx = click.Context(main)
    wrong = []
    for line in _command_lines(page.read_text()):
        try:
            words = shlex.split(line)
        except ValueError:
            words = line.split()
        group_flags = _flags(main, ctx)
        while len(words) > 1 and words[1] in group_flags:  # ``bench --strict-plugins run``
            words.pop(1)
        if len(words) < 2 or words[1] in ("...", "COMMAND"):
            continue
        name = words[1]
        command = main.get_command(ctx, name)
        if command is None:
            if not name.isupper():  # ``bench COMMAND`` placeholders
                wrong.append(f"{line!r}: no command {name!r}")
            continue
        known = _flags(command, click.Context(command, parent=ctx))
        for word in words[2:]:
            flag = word.split("=", 1)[0]
            if flag.startswith("--") and flag not in known:
                wrong.append(f"{line!r}: bench {name} has no {flag}")
    assert not wrong, "\n".join(wrong)
