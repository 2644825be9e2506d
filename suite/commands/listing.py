"""``bench list``: what is registered, each method's options, the names a family of
workloads accepts (``--workloads 'timm:*resnet*'``), and the README's option table
(generated here, and checked against the README by a test)."""

from __future__ import annotations

import fnmatch

from suite.errors import BenchError
from suite.plugins.registry import METHODS, WORKLOADS


def entries_text() -> str:
    lines = []
    for title, registry in (("Methods", METHODS), ("Workloads", WORKLOADS)):
        lines.append(f"{title}:")
        entries = registry.entries()
        width = max((len(e.name) for e in entries), default=0)
        lines += [f"  {e.name:<{width}}  {e.description}" for e in entries]
        families = registry.families()
        if families:
            width = max(width, *(len(f"{p}:NAME") for p in families))
            lines += [f"  {prefix + ':NAME':<{width}}  {text}" for prefix, text in
                      sorted(families.items())]
    lines += ["", "Options of a method: bench list METHOD (all: bench list --options)",
              "A model by name runs as --workload (or --model) timm:NAME / torchvision:NAME "
              "(bench list --workloads 'timm:*resnet*' lists the names a family takes); "
              "bench inspect --model NAME says first whether PruneX's structured path works "
              "on it"]
    return "\n".join(lines) + "\n"


def workload_names_text(pattern: str) -> str:
    """The workloads ``pattern`` names, one a line, each as ``--workload`` takes it.
    ``PREFIX:PATTERN`` lists the family's names that match (``timm:*resnet*``: shell-style,
    as ``timm.list_models`` takes it; ``torchvision:*``: all of them); a pattern without a
    family matches the registered workloads and every family that lists its names.

    Raises:
        BenchError: an unknown family, or nothing matches; one line.
    """
    prefix, colon, rest = pattern.partition(":")
    if colon:
        names = WORKLOADS.family_names(prefix, rest or "*")
    else:
        names = [name for name in WORKLOADS.names() if fnmatch.fnmatchcase(name, pattern)]
        for family in WORKLOADS.browsable_families():
            names += WORKLOADS.family_names(family, pattern)
    if not names:
        raise BenchError(f"no workload matches {pattern!r} (a shell-style pattern, e.g. "
                         "'timm:*resnet*', 'torchvision:*', '*mixnet*')")
    return "\n".join(names) + "\n"


def options_text(names: list[str]) -> str:
    """Each named method's options (all methods if none named): flag, type, default, help."""
    entries = [METHODS.get(n) for n in names] if names else METHODS.entries()
    lines = []
    for entry in entries:
        lines.append(f"{entry.name}:")
        if not entry.options:
            lines.append("  (no options)")
        width = max((len(o.declaration) for o in entry.options), default=0)
        for opt in entry.options:
            limits = f", {opt.check.text}" if opt.check else ""
            lines.append(
                f"  {opt.declaration:<{width}}  {opt.type_text}{limits}; default "
                f"{opt.default_text}. {opt.help}"
            )
        if entry.not_simulable:
            lines.append(f"  (bench sim cannot replay it: {entry.not_simulable})")
    return "\n".join(lines) + "\n"


def options_markdown(*, builtin_only: bool = False) -> str:
    """One row per option: flag, the methods that read it, default, meaning."""
    rows = [
        "| option | methods | default | meaning |",
        "|---|---|---|---|",
    ]
    for opt, readers in METHODS.option_catalogue(builtin_only=builtin_only).values():
        flag = f"`{opt.flag}`/`--{opt.off_flag}`" if opt.off_flag else f"`{opt.flag}`"
        limits = f" ({opt.check.text})" if opt.check else ""
        choices = f" ({', '.join(opt.choices)})" if opt.choices else ""
        rows.append(
            f"| {flag} | {', '.join(f'`{r}`' for r in readers)} | {opt.default_text} | "
            f"{opt.help}{limits}{choices} |"
        )
    return "\n".join(rows) + "\n"


def choices_markdown(defaults: dict[str, str]) -> str:
    """The rows of docs/commands/run.md's table of what ``--method`` and ``--workload``
    take: every built-in method and workload (``defaults``: the flags' defaults)."""
    rows = ["| option | default | one of |", "|---|---|---|"]
    for flag, registry in (("--method", METHODS), ("--workload", WORKLOADS)):
        names = ", ".join(f"`{e.name}`" for e in registry.builtin_entries())
        rows.append(f"| `{flag}` | `{defaults[flag]}` | {names} (`bench list` describes each, "
                    "installed plugins' too) |")
    return "\n".join(rows) + "\n"


def workloads_markdown() -> str:
    """docs/index.md's table of the built-in workloads: name and what it registered."""
    rows = ["| workload | model, data and recipe |", "|---|---|"]
    rows += [f"| `{e.name}` | {e.description} |" for e in WORKLOADS.builtin_entries()]
    return "\n".join(rows) + "\n"
