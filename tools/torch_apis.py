"""Every torch and torchvision API the project's code names, and whether the torch running
this script has it: each dotted name resolved by import and attribute lookup, each keyword
argument passed to it checked against its signature (those passed through ``**`` too, where
the code spells them), and each method called on what a torch call returned checked on the
type torch declares it returns (``torch.cuda.Event().record``).

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
import re
import sys
import typing
from collections import defaultdict
from dataclasses import dataclass, field
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


#: a name's segment that stands for the object a call returned: ``torch.cuda.Event().record``
RETURNED = "()"


@dataclass
class Function:
    """What a project function gives a torch call through ``**``: the keys of the dict
    literals it returns (its ``**kwargs``' keys come from its callers: ``_Uses.callers_keys``)."""

    file: str
    returned_keys: set[str] = field(default_factory=set)


def module_of(file: str) -> str:
    """``suite/compat.py`` -> ``suite.compat``."""
    return file.removesuffix(".py").replace("/", ".").removesuffix(".__init__")


def imported_names(tree: ast.Module, module: str) -> dict[str, str]:
    """A module's names of project functions, qualified: what it imports (``from a.b import
    c as d``: d -> a.b.c; ``import a.b as c``: c -> a.b) and what it defines at its top."""
    names = {node.name: f"{module}.{node.name}" for node in tree.body
             if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.update({a.asname or a.name: f"{node.module}.{a.name}" for a in node.names})
        elif isinstance(node, ast.Import):
            names.update({a.asname or a.name: a.name for a in node.names})
    return names


def qualified(func: ast.AST, names: dict[str, str]) -> str | None:
    """The qualified name a call's function has in its module (None: not one it can name)."""
    parts = []
    while isinstance(func, ast.Attribute):
        parts.append(func.attr)
        func = func.value
    if isinstance(func, ast.Name) and func.id in names:
        return ".".join([names[func.id], *reversed(parts)])
    return None


def project_functions(trees: dict[str, ast.Module]) -> tuple[dict, dict, dict]:
    """Every top-level function defined in ``trees``, by qualified name, every call of one
    with the keywords it passes, and each module's names: ``({name: Function}, {name: {file:
    keywords}}, {module: {name: qualified}})``."""
    functions: dict[str, Function] = {}
    calls: dict[str, dict[str, set[str]]] = defaultdict(dict)
    modules = {module_of(file): imported_names(tree, module_of(file))
               for file, tree in trees.items()}
    for file, tree in trees.items():
        module = module_of(file)
        names = modules[module]
        for node in tree.body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                function = Function(file)
                for inner in ast.walk(node):
                    if isinstance(inner, ast.Return) and inner.value is not None:
                        function.returned_keys |= literal_keys(inner.value)
                functions[f"{module}.{node.name}"] = function
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                name = defined(qualified(node.func, names), modules)
                if name:
                    calls[name].setdefault(file, set()).update(
                        k.arg for k in node.keywords if k.arg)
    return functions, calls, modules


def defined(name: str | None, modules: dict[str, dict[str, str]]) -> str | None:
    """Where ``name`` is defined, following re-exports (``suite.api.f`` -> ``suite.compat.f``)."""
    for _ in range(8):
        if name is None:
            return None
        module, _, attr = name.rpartition(".")
        found = modules.get(module, {}).get(attr)
        if found is None or found == name:
            return name
        name = found
    return name


def literal_keys(node: ast.AST | None) -> set[str]:
    """The string keys of a dict literal (both branches of ``a if c else b``)."""
    if isinstance(node, ast.Dict):
        return {k.value for k in node.keys if isinstance(k, ast.Constant)
                and isinstance(k.value, str)}
    if isinstance(node, ast.IfExp):
        return literal_keys(node.body) | literal_keys(node.orelse)
    if isinstance(node, ast.Call) and last_name(node.func) == "dict":
        return {k.arg for k in node.keywords if k.arg}
    return set()


def merge(into: dict[str, set[str]], more: dict[str, set[str]]) -> None:
    """Add ``more``'s keys to ``into``, file by file."""
    for file, keys in more.items():
        into.setdefault(file, set()).update(keys)


def last_name(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


class _Uses(ast.NodeVisitor):
    """Dotted torch names of one module, with the keywords each call passes and the file each
    keyword is written in: a keyword passed through ``**`` (a dict literal, a local dict, a
    project function's returned dict, a function's own ``**kwargs`` from its callers) is
    attributed to the file that spells it. A method called on what a torch call returned
    (``torch.cuda.Event(...)``, assigned to a name or an attribute first, or called at once)
    is named ``torch.cuda.Event().elapsed_time``."""

    def __init__(self, file: str = "", functions: dict | None = None,
                 calls: dict | None = None) -> None:
        self.file = file
        self.module = module_of(file)
        self.project: dict[str, str] = {}  # names of project functions, qualified
        self.modules: dict[str, dict[str, str]] = {}  # every module's, for re-exports
        self.functions = functions or {}
        self.calls = calls or {}
        self.aliases: dict[str, str] = {}
        self.names: dict[str, dict[str, set[str]]] = defaultdict(dict)
        self.dicts: dict[str, dict[str, set[str]]] = {}  # local dict name -> file -> keys
        self.returned: dict[str, str] = {}  # ``x`` / ``self.x`` -> the torch call it holds
        self.scope: list[ast.AST] = []

    def use(self, name: str, keywords: dict[str, set[str]] | None = None) -> None:
        files = self.names[name]
        files.setdefault(self.file, set())
        for file, keys in (keywords or {}).items():
            files.setdefault(file, set()).update(keys)

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if alias.name.split(".")[0] in ROOTS:
                if alias.asname:
                    self.aliases[alias.asname] = alias.name
                else:
                    self.aliases[alias.name.split(".")[0]] = alias.name.split(".")[0]
                self.use(alias.name)  # the module itself is used

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level or not node.module or node.module.split(".")[0] not in ROOTS:
            return
        for alias in node.names:
            dotted = f"{node.module}.{alias.name}"
            self.aliases[alias.asname or alias.name] = dotted
            self.use(dotted)

    def visit_FunctionDef(self, node) -> None:
        saved = self.dicts, self.returned
        self.dicts, self.returned = {}, {k: v for k, v in saved[1].items()
                                         if k.startswith("self.")}
        self.scope.append(node)
        self.generic_visit(node)
        self.scope.pop()
        self.dicts, self.returned = saved[0], {**saved[1], **{
            k: v for k, v in self.returned.items() if k.startswith("self.")}}

    visit_AsyncFunctionDef = visit_FunctionDef

    def holder(self, node: ast.AST) -> str | None:
        """``x`` or ``self.x``: where a returned object can be kept."""
        if isinstance(node, ast.Name):
            return node.id
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                and node.value.id == "self"):
            return f"self.{node.attr}"
        return None

    def visit_Assign(self, node: ast.Assign) -> None:
        keys = literal_keys(node.value)
        returned = self.call_name(node.value)
        for target in node.targets:
            where = self.holder(target)
            if where:  # a new value: what the name held before is gone
                self.dicts.pop(where, None)
                self.returned.pop(where, None)
            if where and keys:
                self.dicts[where] = {self.file: set(keys)}
            if where and returned:
                self.returned[where] = returned
            if (isinstance(target, ast.Subscript) and isinstance(target.value, ast.Name)
                    and isinstance(target.slice, ast.Constant)
                    and isinstance(target.slice.value, str)):  # kwargs["key"] = value
                self.dicts.setdefault(target.value.id, {}).setdefault(self.file, set()).add(
                    target.slice.value)
        self.generic_visit(node)

    def call_name(self, node: ast.AST) -> str | None:
        """``torch.cuda.Event()`` for a call of a torch name, else None."""
        if isinstance(node, ast.Call):
            name = self.dotted(node.func)
            if name is not None:
                return name + RETURNED
        return None

    def dotted(self, node: ast.AST) -> str | None:
        parts = []
        while isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
            holder = self.holder(node) if isinstance(node, ast.Attribute) else None
            if holder in self.returned:
                return ".".join([self.returned[holder], *reversed(parts)])
        if isinstance(node, ast.Call):
            inner = self.call_name(node)
            return ".".join([inner, *reversed(parts)]) if inner and parts else None
        if isinstance(node, ast.Name) and node.id in self.aliases:
            return ".".join([self.aliases[node.id], *reversed(parts)])
        if isinstance(node, ast.Name) and node.id in self.returned and parts:
            return ".".join([self.returned[node.id], *reversed(parts)])
        return None

    def visit_Attribute(self, node: ast.Attribute) -> None:
        name = self.dotted(node)
        if name is not None:
            self.use(name)
            if isinstance(node.value, ast.Call):
                self.visit(node.value)  # the call's own arguments and name
            return  # the chain's inner attributes are prefixes of it
        self.generic_visit(node)

    def spread_keys(self, node: ast.AST) -> dict[str, set[str]]:
        """file -> the keys a ``**node`` passes, where they can be read."""
        found: dict[str, set[str]] = defaultdict(set)
        keys = literal_keys(node)
        if keys:
            found[self.file] |= keys
        if isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values):
                if key is None:  # {**other, ...}
                    merge(found, self.spread_keys(value))
        elif isinstance(node, ast.Name):
            merge(found, self.dicts.get(node.id, {}))
            merge(found, self.callers_keys(node.id))
        elif isinstance(node, ast.Call):
            function = self.functions.get(
                defined(qualified(node.func, self.project), self.modules) or "")
            if function is not None:
                found[function.file] |= function.returned_keys
        return found

    def callers_keys(self, name: str) -> dict[str, set[str]]:
        """Where ``name`` is the enclosing top-level function's ``**kwargs``: the keywords
        its callers pass that none of its named parameters takes, by the caller's file."""
        function = self.scope[-1] if len(self.scope) == 1 else None
        if function is None or not function.args.kwarg or function.args.kwarg.arg != name:
            return {}
        params = {a.arg for a in [*function.args.args, *function.args.kwonlyargs]}
        callers = self.calls.get(f"{self.module}.{function.name}", {})
        return {file: more - params for file, more in callers.items()}

    def visit_Call(self, node: ast.Call) -> None:
        name = self.dotted(node.func)
        if name is not None:
            passed: dict[str, set[str]] = {self.file: {k.arg for k in node.keywords if k.arg}}
            for keyword in node.keywords:
                if keyword.arg is None:
                    for file, keys in self.spread_keys(keyword.value).items():
                        passed.setdefault(file, set()).update(keys)
            self.use(name, passed)
        self.generic_visit(node)


def uses(files: list[Path]) -> dict[str, dict[str, set[str]]]:
    """name -> {file: keywords passed there} over ``files``."""
    trees = {}
    for path in files:
        rel = str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)
        trees[rel] = ast.parse(path.read_text(), str(path))
    functions, calls, modules = project_functions(trees)
    found: dict[str, dict[str, set[str]]] = defaultdict(dict)
    for rel, tree in trees.items():
        visitor = _Uses(rel, functions, calls)
        visitor.project, visitor.modules = modules[module_of(rel)], modules
        visitor.visit(tree)
        for name, files in visitor.names.items():
            for file, keywords in files.items():
                found[name].setdefault(file, set()).update(keywords)
    return dict(found)


def without_prefixes(names) -> list[str]:
    """The names that are no prefix of another (``torch.cuda`` goes when ``torch.cuda.Event``
    is there): the list a reader checks."""
    names = sorted(set(names))
    return [n for n in names if not any(o.startswith(n + ".") for o in names)]


class Unknown(LookupError):
    """What a torch function returns is not declared: its methods cannot be checked."""


def returned_type(obj):
    """The class of what calling ``obj`` returns: itself for a class, else its return
    annotation (Optional unwrapped); raises Unknown where that is not declared."""
    if isinstance(obj, type):
        return obj
    try:
        hint = typing.get_type_hints(obj).get("return")
    except Exception:  # unresolvable annotations, C functions
        hint = None
    options = [a for a in typing.get_args(hint) if a is not type(None)] if typing.get_args(
        hint) else [hint]
    if len(options) == 1 and isinstance(options[0], type) and options[0] is not typing.Any:
        return options[0]
    raise Unknown(f"what {getattr(obj, '__qualname__', obj)} returns is not declared")


def has_member(cls: type, attr: str) -> bool:
    """Whether instances of ``cls`` have ``attr``: on the class, annotated, or assigned as
    ``self.attr`` in its source (an instance attribute); raises Unknown where the source of
    a class without it cannot be read (a C extension's)."""
    if hasattr(cls, attr):
        return True
    unread = False
    for klass in cls.__mro__:
        if attr in getattr(klass, "__annotations__", {}):
            return True
        if klass is object:
            continue
        try:
            source = inspect.getsource(klass)
        except (OSError, TypeError):
            unread = True
            continue
        if re.search(rf"\bself\.{re.escape(attr)}\b\s*(:[^=]*)?=", source):
            return True
    if unread:
        raise Unknown(f"{cls.__qualname__}'s source cannot be read for {attr}")
    return False


def walk(obj, attrs: list[str], where: str):
    """``obj.a.b``: each attribute looked up; past an attribute that is no module or class
    (an instance's value, a property) nothing more can be checked (Unknown)."""
    for i, attr in enumerate(attrs):
        if isinstance(obj, type) and where == "instance":
            if not has_member(obj, attr):
                raise LookupError(f"{obj.__module__}.{obj.__qualname__} has no {attr}")
            if not hasattr(obj, attr):  # an instance attribute: its type is not declared
                if i + 1 < len(attrs):
                    raise Unknown(f"{attr}'s type is not declared")
                return None
        elif not hasattr(obj, attr):
            raise LookupError(f"{getattr(obj, '__name__', obj)} has no {attr}")
        obj = getattr(obj, attr)
        where = "namespace"
        if i + 1 < len(attrs) and not (inspect.ismodule(obj) or isinstance(obj, type)):
            raise Unknown(f"what {attr} holds is not declared")
    return obj


def resolve(name: str):
    """The object ``name`` names in the running torch; raises LookupError when it lacks it
    (Unknown where a returned object's type is not declared)."""
    first, *returned = name.split(RETURNED)
    obj = resolve_plain(first)
    for segment in returned:
        obj = walk(returned_type(obj), list(filter(None, segment.split("."))), "instance")
    return obj


def resolve_plain(name: str):
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
        except Unknown:
            continue  # counted as checked by name only: torch does not say what it returns
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
