"""Every torch and torchvision API the project's code names, and whether the torch running
this script has it: each dotted name resolved by import and attribute lookup, and each
keyword argument passed to it checked against its signature.

Why: the suite supports a range of torch releases (pyproject.toml), and an API newer than the
floor is reached only through suite.compat. Run this under the floor release to see what it
lacks (``python tools/torch_apis.py``: exit 1 when anything is missing outside
suite.compat); ``--list`` prints the names alone, as suite.compat's docstring lists them.

Examples:
    python tools/torch_apis.py            # check against the torch imported here
    python tools/torch_apis.py --list     # the names, one line per module
"""

from __future__ import annotations

import argparse
import ast
import importlib
import inspect
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: the code that runs against the user's torch (tools/ included: tools/gpu/run runs there)
SOURCES = ("suite", "methods", "baselines", "workloads", "benchmarks", "tests", "tools",
           "noxfile.py")
#: test support that deliberately replaces torch's newer APIs (the floor's look-alike)
EXCLUDED = ("tests/support/torch_floor",)
ROOTS = ("torch", "torchvision")
#: where newer APIs are reached on purpose, detected before use
COMPAT = "suite/compat.py"


def source_files(root: Path = ROOT) -> list[Path]:
    files = []
    for name in SOURCES:
        path = root / name
        files += sorted(path.rglob("*.py")) if path.is_dir() else [path]
    return [f for f in files if f.exists()
            and not str(f.relative_to(root)).startswith(EXCLUDED)]


class _Uses(ast.NodeVisitor):
    """Dotted torch names of one module, with the keywords each call passes."""

    def __init__(self) -> None:
        self.aliases: dict[str, str] = {}
        self.names: dict[str, set[str]] = defaultdict(set)  # name -> keywords passed

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if alias.name.split(".")[0] in ROOTS:
                if alias.asname:
                    self.aliases[alias.asname] = alias.name
                else:
                    self.aliases[alias.name.split(".")[0]] = alias.name.split(".")[0]
                self.names[alias.name]  # noqa: B018 (the module itself is used)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level or not node.module or node.module.split(".")[0] not in ROOTS:
            return
        for alias in node.names:
            dotted = f"{node.module}.{alias.name}"
            self.aliases[alias.asname or alias.name] = dotted
            self.names[dotted]  # noqa: B018

    def dotted(self, node: ast.AST) -> str | None:
        parts = []
        while isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        if isinstance(node, ast.Name) and node.id in self.aliases:
            return ".".join([self.aliases[node.id], *reversed(parts)])
        return None

    def visit_Attribute(self, node: ast.Attribute) -> None:
        name = self.dotted(node)
        if name is not None:
            self.names[name]  # noqa: B018
            return  # the chain's inner attributes are prefixes of it
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        name = self.dotted(node.func)
        if name is not None:
            self.names[name].update(k.arg for k in node.keywords if k.arg)
        self.generic_visit(node)


def uses(files: list[Path]) -> dict[str, dict[str, set[str]]]:
    """name -> {file: keywords passed there} over ``files``."""
    found: dict[str, dict[str, set[str]]] = defaultdict(dict)
    for path in files:
        visitor = _Uses()
        visitor.visit(ast.parse(path.read_text(), str(path)))
        rel = str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)
        for name, keywords in visitor.names.items():
            found[name].setdefault(rel, set()).update(keywords)
    return dict(found)


def without_prefixes(names) -> list[str]:
    """The names that are no prefix of another (``torch.cuda`` goes when ``torch.cuda.Event``
    is there): the list a reader checks."""
    names = sorted(set(names))
    return [n for n in names if not any(o.startswith(n + ".") for o in names)]


def resolve(name: str):
    """The object ``name`` names in the running torch; raises LookupError when it lacks it."""
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            if not hasattr(obj, attr):
                raise LookupError(f"{'.'.join(parts[:cut])} has no {'.'.join(parts[cut:])}")
            obj = getattr(obj, attr)
        return obj
    raise LookupError(f"no module {parts[0]}")


def missing_keywords(obj, keywords: set[str]) -> set[str]:
    """Keywords ``obj`` does not take (none where its signature cannot be read or it takes
    ``**kwargs``)."""
    try:
        params = inspect.signature(obj).parameters
    except (TypeError, ValueError):
        return set()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return set()
    return {k for k in keywords if k not in params}


def check(found: dict[str, dict[str, set[str]]]) -> list[str]:
    """One line per name or keyword the running torch lacks, naming the files that use it."""
    problems = []
    for name in sorted(found):
        files = found[name]
        try:
            obj = resolve(name)
        except LookupError as exc:
            problems.append(f"{name}: {exc} (used in {', '.join(sorted(files))})")
            continue
        for path, keywords in sorted(files.items()):
            lacking = missing_keywords(obj, keywords)
            if lacking:
                problems.append(f"{name}({', '.join(f'{k}=' for k in sorted(lacking))}): not "
                                f"taken (used in {path})")
    return problems


def grouped(names: list[str]) -> list[str]:
    """``module: a, b, c`` lines, grouped by the name's parent."""
    groups: dict[str, list[str]] = defaultdict(list)
    for name in names:
        parent, _, leaf = name.rpartition(".")
        groups[parent or name].append(leaf if parent else "")
    return [f"{parent}: {', '.join(sorted(v for v in leaves if v))}".rstrip(": ")
            for parent, leaves in sorted(groups.items())]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--list", action="store_true", help="print the names, grouped")
    args = parser.parse_args(argv)
    found = uses(source_files())
    if args.list:
        print("\n".join(grouped(without_prefixes(found))))
        return 0
    import torch

    problems = check(found)
    outside = [p for p in problems if not p.endswith(f"(used in {COMPAT})")]
    print(f"torch {torch.__version__}: {len(found)} names checked, {len(problems)} missing "
          f"({len(problems) - len(outside)} of them reached through {COMPAT} only)")
    for line in problems:
        print(f"  {line}")
    return 1 if outside else 0


if __name__ == "__main__":
    sys.exit(main())
