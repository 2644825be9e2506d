"""The house's floor plan, read from the AST of every module (function-local imports
included): no import cycle between files or between sub-packages, the framework's
sub-packages only import downward in the order of ``LAYERS``, and the framework never imports
a plugin (the built-ins included: they are found through entry points)."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("suite", "methods", "baselines", "workloads")
#: the framework's rooms, bottom first: a module may import its own room and those below it
LAYERS = [
    "suite.startup_signals",
    "suite.errors",
    "suite.environment",
    "suite.compat",
    "suite.config",
    "suite.processes",
    "suite.results",
    "suite.gate",
    "suite.data",
    "suite.cluster",
    "suite.plugins",
    "suite.structured",
    "suite.api",
    "suite.run",
    "suite.launchers",
    "suite.sim",
    "suite.report",
    "suite.commands",
    "suite.cli",
    "suite.start",
]
PLUGINS = ("methods", "baselines", "workloads")


def module_name(path: Path, root: Path = REPO) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(root: Path = REPO) -> dict[str, set[str]]:
    """Module -> the project modules it imports (``from a.b import c`` counts ``a.b.c`` when
    that is a module, else ``a.b``; a package's own submodules are not edges of it)."""
    modules = {module_name(p, root): p for pkg in PACKAGES for p in (root / pkg).rglob("*.py")}

    def resolve(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        edges = graph.setdefault(name, set())
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [f"{node.module}.{alias.name}" for alias in node.names]
            else:
                continue
            for target in map(resolve, targets):
                if target and target != name and not name.startswith(f"{target}."):
                    edges.add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for succ in graph.get(node, ()):
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def room(module: str) -> str:
    """The sub-package (``suite.run``), top-level module (``suite.cli``) or plugin package."""
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "suite" and len(parts) > 1 else parts[0]


def rooms_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    rooms: dict[str, set[str]] = {}
    for module, targets in graph.items():
        rooms.setdefault(room(module), set()).update(
            room(t) for t in targets if room(t) != room(module)
        )
    return rooms


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    found = []
    for module, targets in sorted(graph.items()):
        here = room(module)
        for target in sorted(targets):
            there = room(target)
            if here.startswith("suite") and there in PLUGINS:
                found.append(f"{module} imports the plugin {target}")
            elif here in LAYERS and there in LAYERS and LAYERS.index(there) > LAYERS.index(here):
                found.append(f"{module} ({here}) imports {target} ({there}), a room above it")
    return found


def test_no_import_cycle_between_files():
    assert cycles(import_graph()) == []


def test_no_import_cycle_between_sub_packages():
    assert cycles(rooms_graph(import_graph())) == []


def test_the_framework_imports_only_downward_and_no_plugin():
    graph = import_graph()
    unknown = {room(m) for m in graph if m.startswith("suite.")} - set(LAYERS)
    assert not unknown, f"place the new room(s) {sorted(unknown)} in LAYERS"
    assert upward_imports(graph) == []


def test_the_checks_see_what_they_forbid(tmp_path):
    for path, text in {
        "suite/__init__.py": "",
        "suite/cluster/__init__.py": "",
        "suite/cluster/a.py": "def f():\n    from suite.run.b import g\n",
        "suite/run/__init__.py": "",
        "suite/run/b.py": "from suite.cluster.a import f\nimport methods.x\n",
        "methods/__init__.py": "",
        "methods/x.py": "",
    }.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text)
    graph = import_graph(tmp_path)
    assert cycles(graph) == [["suite.cluster.a", "suite.run.b"]]
    assert cycles(rooms_graph(graph)) == [["suite.cluster", "suite.run"]]
    assert upward_imports(graph) == [
        "suite.cluster.a (suite.cluster) imports suite.run.b (suite.run), a room above it",
        "suite.run.b imports the plugin methods.x",
    ]


def unexplained_local_imports(root: Path = REPO) -> list[str]:
    """Imports inside functions with no comment (above their block or on their line) saying
    why: a module imported lazily for its cost, or for a path only one command takes."""
    found = []
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            lines = path.read_text().splitlines()
            for fn in ast.walk(ast.parse("\n".join(lines))):
                if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
                    continue
                for node in ast.walk(fn):
                    if not isinstance(node, ast.Import | ast.ImportFrom):
                        continue
                    above = node.lineno - 2
                    while above >= 0 and lines[above].strip().startswith(("import ", "from ")):
                        above -= 1
                    said = "#" in lines[node.lineno - 1] or (
                        above >= 0 and lines[above].strip().startswith("#"))
                    if not said:
                        found.append(f"{path.relative_to(root)}:{node.lineno}")
    return found


def test_every_function_local_import_says_why():
    assert not unexplained_local_imports(), unexplained_local_imports()


def plugin_name_tests(tree: ast.Module, names: set[str]) -> list[tuple[int, str]]:
    """Where code tests a value against a method's name: ``== "ddp"``, ``!= "topk"``,
    ``in ("ddp", "powersgd")``, ``.startswith("prunex")`` (a prefix of any name)."""
    found = []
    for node in ast.walk(tree):
        constants: list[ast.AST] = []
        if isinstance(node, ast.Compare):
            for side in (node.left, *node.comparators):
                constants += side.elts if isinstance(side, (ast.Tuple, ast.List, ast.Set)) else [
                    side]
            hits = [c.value for c in constants if isinstance(c, ast.Constant) and c.value in names]
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr in ("startswith", "endswith") and node.args):
            prefixes = node.args[0].elts if isinstance(node.args[0], ast.Tuple) else [node.args[0]]
            hits = [p.value for p in prefixes if isinstance(p, ast.Constant)
                    and isinstance(p.value, str) and p.value
                    and any(n.startswith(p.value) or n.endswith(p.value) for n in names)]
        else:
            continue
        found += [(node.lineno, hit) for hit in hits]
    return found


def test_the_framework_tests_no_plugins_name():
    """What a method is comes from its registration (its look, activity, figures, the
    overlap it declares), never from its name: a renamed built-in or a third-party method
    works everywhere a built-in does. The gate's dense reference is named once
    (suite.results.catalogue.DENSE_METHOD) and compared through that name."""
    from suite.plugins.registry import METHODS

    names = set(METHODS.names())
    assert {"prunex", "ddp", "powersgd"} <= names
    found = [f"{path.relative_to(REPO)}:{line}: {name!r}"
             for path in sorted((REPO / "suite").rglob("*.py"))
             for line, name in plugin_name_tests(ast.parse(path.read_text()), names)]
    assert not found, "the framework tests a plugin's name:\n" + "\n".join(found)
    planted = ast.parse('m == "ddp"\nm in ("topk", "x")\nm.startswith("prunex")\nm == "dd"\n')
    assert [name for _, name in plugin_name_tests(planted, names)] == ["ddp", "topk", "prunex"]


#: the longest a module of the framework may grow before it is split by idea
MAX_MODULE_LINES = 650


def test_the_complexity_budget_holds():
    """No function over ruff's complexity 10 or 50 statements outside the exceptions
    pyproject.toml names with a reason, and no framework module over MAX_MODULE_LINES."""
    import subprocess
    import sys
    import tomllib

    proc = subprocess.run([sys.executable, "-m", "ruff", "check", "--select", "C901,PLR0915",
                           "--output-format", "concise", "."], cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout
    lint = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["ruff"]["lint"]
    excepted = {path for path, rules in lint["per-file-ignores"].items()
                if {"C901", "PLR0915"} & set(rules)}
    assert excepted == {"tests/**"}, excepted
    long = [f"{path.relative_to(REPO)}: {n} lines" for path in sorted((REPO / "suite").rglob(
        "*.py")) if (n := len(path.read_text().splitlines())) > MAX_MODULE_LINES]
    assert not long, "split these by idea:\n" + "\n".join(long)


def python_scripts(root: Path) -> list[Path]:
    """Files under tools/ and .ci/ whose first line runs Python, whatever their name ends
    with (tools/gpu/plan has no suffix)."""
    found = []
    for folder in ("tools", ".ci"):
        for path in sorted((root / folder).rglob("*")):
            if path.is_file() and not path.is_symlink():
                with path.open("rb") as file:
                    first = file.readline(200)
                if path.suffix == ".py" or (first.startswith(b"#!") and b"python" in first):
                    found.append(path.resolve())
    return found


def test_ruff_checks_every_python_script_of_the_tools():
    """`ruff check .` finds only ``*.py``; a Python script without the suffix is linted only
    where pyproject.toml's extend-include names it (issue 65): each one is."""
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "ruff", "check", "--show-files", "."],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    checked = {Path(line.strip()).resolve() for line in proc.stdout.splitlines()}
    scripts = python_scripts(REPO)
    assert REPO / "tools" / "gpu" / "plan" in scripts  # the scan sees suffix-less scripts
    missing = [str(path.relative_to(REPO)) for path in scripts if path not in checked]
    assert not missing, "add these to [tool.ruff] extend-include:\n" + "\n".join(missing)
