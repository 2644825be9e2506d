"""Write the docs' tables that come from the registry: every method option
(docs/options.md), what ``--method`` and ``--workload`` take (docs/commands/run.md) and the
built-in workloads (docs/index.md), each between its page's ``<!-- NAME:begin -->`` and
``<!-- NAME:end -->`` markers. tests/commands/test_options.py checks that they are current.

    python tools/docs_tables.py
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def tables() -> dict[tuple[str, str], str]:
    """(page, marker) -> the table that belongs there, from the registry."""
    from suite.cli import main
    from suite.commands.listing import choices_markdown, options_markdown, workloads_markdown

    run = main.commands["run"]
    defaults = {f"--{p.name}": p.default for p in run.params if p.name in ("method", "workload")}
    return {
        ("docs/options.md", "options"): options_markdown(builtin_only=True),
        ("docs/commands/run.md", "choices"): choices_markdown(defaults),
        ("docs/index.md", "workloads"): workloads_markdown(),
    }


def section(text: str, marker: str) -> re.Match | None:
    return re.search(rf"<!-- {marker}:begin -->\n(.*?)<!-- {marker}:end -->", text, re.S)


def main() -> int:
    for (page, marker), table in tables().items():
        path = ROOT / page
        text = path.read_text()
        found = section(text, marker)
        if found is None:
            print(f"{page} has no <!-- {marker}:begin --> ... <!-- {marker}:end --> section")
            return 1
        path.write_text(text[: found.start(1)] + table + text[found.end(1) :])
    return 0


if __name__ == "__main__":
    sys.exit(main())
