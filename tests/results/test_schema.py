"""The run-folder format is declared in one place: every key a reader or writer in ``suite/``
uses is a name of ``suite.results.schema``, never a string spelled out, so a key renamed there
is renamed everywhere (asv keeps its result keys in one module the same way)."""

from __future__ import annotations

import ast
from pathlib import Path

from suite.results import schema

REPO = Path(__file__).resolve().parents[2]
SUITE = REPO / "suite"
#: the plugins and the measurements, which read and write the same format through
#: ``suite.api.schema``
PLUGIN_FOLDERS = ("methods", "baselines", "workloads", "benchmarks")

#: where a string in a key's position is not a run folder's key, though it spells one: the
#: command line's keyword arguments are named after options (``kwargs["gpus"]`` is --gpus)
ALLOWED_RECEIVERS = {"kwargs"}
#: (module, word): the few other places a key's word means something else
ALLOWED = {
    ("suite/launchers/slurm.py", "nodes"),  # submitit's parameters
    ("suite/launchers/slurm.py", "gpus_per_node"),
    ("suite/run/loop.py", "torch"),  # a checkpoint's random states, by library
    ("suite/run/loop.py", "cuda"),
    ("suite/run/loop.py", "method"),  # a checkpoint's method state
    ("suite/run/loop.py", "loss"),  # the progress bar's words
    ("suite/gate/compare.py", "accuracy"),  # --metric's alias of final_accuracy
    ("suite/commands/preflight.py", "accuracy_from"),  # the --accuracy-from option
    ("suite/commands/simulate.py", "accuracy_from"),
    ("suite/cluster/ranks.py", "world_size"),  # init_process_group's keywords
    ("suite/plugins/method.py", "lr"),  # torch's optimizer param groups
    ("suite/config.py", "accuracy_from"),  # the --accuracy-from option
    ("suite/run/build.py", "steps_per_iteration"),  # the Method attribute's name
    ("suite/report/labels.py", "budget"),  # a label's part: the budget in words
    ("suite/report/figure_data.py", "budget"),
    # checkpoint state (a resumed run loads these keys), not the run folder's
    ("methods/prunex/method.py", "rho1"),
    ("methods/prunex/method.py", "rho2"),
    ("methods/prunex/freeze.py", "frozen"),
    ("methods/prunex/freeze.py", "warnings"),
    ("tests/plugin_example/benchplugin.py", "model"),
    ("methods/prunex/method.py", "weight_decay"),  # torch's optimizer param groups
    ("baselines/powersgd.py", "error"),
    ("baselines/powersgd.py", "parameters"),
    # a benchmark's --smoke options and its own table's columns, named after the flags
    ("benchmarks/emulated_comm.py", "gpus_per_node"),
    ("benchmarks/fair_comparison.py", "gpus_per_node"),
    ("benchmarks/families.py", "gpus_per_node"),
    ("benchmarks/frontier.py", "gpus_per_node"),
    ("benchmarks/instrumentation_tax.py", "gpus_per_node"),
    ("benchmarks/resume_equality.py", "gpus_per_node"),
    ("benchmarks/capacity_control.py", "accuracy"),  # its table: final accuracy in %
    ("benchmarks/capacity_control.py", "density"),  # the last round's, as its table says
    ("benchmarks/checkpoint_cost.py", "model"),  # the workload's name
    ("benchmarks/emulated_comm.py", "gpus"),
    ("benchmarks/emulated_comm.py", "iterations"),  # steady iterations measured
    ("benchmarks/gpu_steps.py", "iterations"),
    ("benchmarks/gpu_steps.py", "layout"),
    ("benchmarks/instrumentation_tax.py", "gpus"),
    ("benchmarks/instrumentation_tax.py", "dataset"),
    ("benchmarks/live_weights.py", "model"),  # the --models name
    ("benchmarks/resume_equality.py", "iterations"),  # --iterations per kind of method
    ("benchmarks/resume_equality.py", "gpus"),
    ("benchmarks/runs.py", "accuracy"),  # its run table: final accuracy in %
    ("benchmarks/validate_sim.py", "iteration"),  # the whole iteration's time, its own key
    ("benchmarks/validate_sim.py", "layout"),  # a cell's layout string (2x1)
    # the scale benchmarks' --smoke options, named after the flags they set
    *((script, key) for script in ("benchmarks/orchestration.py", "benchmarks/rank_kill.py",
                                   "benchmarks/rank_memory.py")
      for key in ("dataset", "gpus_per_node", "iterations")),
}
#: modules of other formats whose keys spell some of the run folder's: a hardware profile and
#: its calibration plan (suite.sim), the command line's option names
OTHER_FORMATS = {"suite/sim/calibrate.py", "suite/sim/fit.py", "suite/sim/measure.py",
                 "suite/sim/profile.py", "suite/commands/flags.py"}


def declared_keys() -> set[str]:
    """Every key the schema declares: the string constants of its module (keys, columns and
    the keys of the manifest's sections), less the column prefix."""
    return {value for name, value in vars(schema).items()
            if name.isupper() and isinstance(value, str) and value != schema.PHASE_PREFIX}


def reads_run_folders(path: Path, tree: ast.Module) -> bool:
    """The run-folder format's own rooms, every module that imports from them, and every
    plugin or benchmark that takes the schema's names from ``suite.api``."""
    if path.parent.name in ("results", "gate"):
        return True
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and (
                node.module.startswith(("suite.results", "suite.gate"))):
            return True
        if isinstance(node, ast.ImportFrom) and node.module == "suite.api" and any(
                alias.name == "schema" for alias in node.names):
            return True
    return False


def receiver(node: ast.AST) -> str:
    """The root name of what is indexed (``kwargs`` of ``kwargs["gpus"]``)."""
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Call)):
        node = node.value if not isinstance(node, ast.Call) else node.func
    return node.id if isinstance(node, ast.Name) else ""


def key_literals(tree: ast.Module, distinctive: set[str] = frozenset()) -> list[tuple[int, str]]:
    """String constants in a key's position: an index (``x["k"]``), the key of
    ``.get``/``.pop``/``.setdefault``, a membership test (``"k" in x``), a dict display's key,
    and the column arguments of a frame's ``groupby``/``sort_values``; and anywhere, a string
    that is one of the ``distinctive`` keys (``final_accuracy``: no other word is spelled so),
    as grep would find it."""
    found = [(node.lineno, node.value) for node in ast.walk(tree)
             if isinstance(node, ast.Constant) and node.value in distinctive]
    for node in ast.walk(tree):
        constants: list[ast.AST] = []
        if isinstance(node, ast.Subscript):
            if receiver(node.value) not in ALLOWED_RECEIVERS:
                constants.append(node.slice)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr in ("get", "pop", "setdefault") and node.args:
                if receiver(node.func.value) not in ALLOWED_RECEIVERS:
                    constants.append(node.args[0])
            if node.func.attr in ("groupby", "sort_values", "drop_duplicates"):
                for arg in node.args[:1]:
                    constants += arg.elts if isinstance(arg, (ast.List, ast.Tuple)) else [arg]
        elif isinstance(node, ast.Compare) and any(
                isinstance(op, (ast.In, ast.NotIn)) for op in node.ops):
            constants.append(node.left)
        elif isinstance(node, ast.Dict):
            constants += [key for key in node.keys if key is not None]
        for constant in constants:
            if isinstance(constant, ast.Constant) and isinstance(constant.value, str):
                found.append((constant.lineno, constant.value))
    return found


def checked_files() -> list[Path]:
    """The framework's modules and the plugins' and benchmarks' (the example plugin's too)."""
    files = sorted(SUITE.rglob("*.py"))
    for folder in (*PLUGIN_FOLDERS, "tests/plugin_example"):
        files += sorted((REPO / folder).glob("**/*.py"))
    return files


def test_no_result_key_is_spelled_out_in_suite():
    """Nor in methods/, baselines/, workloads/, benchmarks/ (through ``suite.api.schema``)."""
    keys = declared_keys()
    distinctive = {key for key in keys if "_" in key}
    spelled = []
    for path in checked_files():
        module = str(path.relative_to(REPO))
        if path == SUITE / "results" / "schema.py" or module in OTHER_FORMATS:
            continue
        tree = ast.parse(path.read_text())
        # every module: the distinctive keys, as grep finds them; the modules that read or
        # write run folders: every key in a key's position too
        found = key_literals(tree, distinctive)
        if not reads_run_folders(path, tree):
            found = [(line, value) for line, value in found if value in distinctive]
        spelled += sorted({f"{module}:{line}: {value!r}" for line, value in found
                           if value in keys and (module, value) not in ALLOWED})
    assert not spelled, "result keys spelled out (use suite.results.schema's names):\n" + (
        "\n".join(spelled))


def test_the_check_finds_a_spelled_out_key():
    """The scan itself: each key position it claims to see is seen, and kwargs are not."""
    code = ('summary["final_accuracy"]; run.get("method"); "loss" in rows\n'
            '{"run_id": 1}; frame.groupby(["iteration", "rank"]); kwargs["gpus"]\n')
    assert [value for _, value in key_literals(ast.parse(code))] == [
        "final_accuracy", "method", "loss", "run_id", "iteration", "rank"]


def test_every_file_lists_its_keys_once():
    for keys in (schema.SUMMARY_FILE_KEYS, schema.MANIFEST_FILE_KEYS, schema.ITERATION_COLUMNS,
                 schema.EVAL_COLUMNS, schema.LAYER_COLUMNS):
        assert len(keys) == len(set(keys)), keys
    assert set(schema.SUMMARY_KEYS) <= set(schema.SUMMARY_FILE_KEYS)


#: modules whose ``status`` is not a run's: an inspection's ``ok`` or ``refused`` (and the
#: benchmark that times inspections)
OTHER_STATUSES = {"suite/commands/inspection.py", "benchmarks/inspect_timing.py"}


def mentions_status(node: ast.AST) -> bool:
    """``schema.STATUS``, ``STATUS`` or a ``status`` name or attribute anywhere in ``node``."""
    return any(isinstance(n, ast.Attribute) and n.attr in ("STATUS", "status")
               or isinstance(n, ast.Name) and n.id in ("STATUS", "status")
               for n in ast.walk(node))


def status_literals(tree: ast.Module) -> list[tuple[int, str]]:
    """A run status spelled as a string where a status is compared (``x.status == "ok"``,
    ``summary.get(schema.STATUS) in ("ok", ...)``) or written (``{schema.STATUS: "failed"}``,
    ``status = "ok"``, ``status="ok"``)."""
    statuses = {status.value for status in schema.Status}
    found = []
    for node in ast.walk(tree):
        values: list[ast.AST] = []
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(map(mentions_status, sides)):
                values = [side for side in sides if not mentions_status(side)]
        elif isinstance(node, ast.Dict):
            values = [v for k, v in zip(node.keys, node.values)
                      if k is not None and mentions_status(k)]
        elif isinstance(node, ast.Assign) and any(map(mentions_status, node.targets)):
            values = [node.value]
        elif isinstance(node, ast.keyword) and node.arg == "status":
            values = [node.value]
        found += [(n.lineno, n.value) for value in values for n in ast.walk(value)
                  if isinstance(n, ast.Constant) and n.value in statuses]
    return found


def test_a_run_status_is_always_a_status():
    """Every status a module writes or compares is ``schema.Status``'s (issue 65: string
    statuses sat in six places beside it), so a status renamed there is renamed everywhere."""
    spelled = []
    for path in checked_files():
        module = str(path.relative_to(REPO))
        if path == SUITE / "results" / "schema.py" or module in OTHER_STATUSES:
            continue
        spelled += [f"{module}:{line}: {value!r}"
                    for line, value in status_literals(ast.parse(path.read_text()))]
    assert not spelled, "statuses spelled out (use schema.Status):\n" + "\n".join(spelled)


def test_the_status_scan_finds_a_spelled_status():
    code = ('summary.get(schema.STATUS) != "ok"; [r for r in rows if r.status == "failed"]\n'
            '{schema.STATUS: "interrupted"}; status = "running"; mark(status="ok")\n'
            'found.status == Status.OK; {"kind": "ok"}\n')
    assert [value for _, value in sorted(status_literals(ast.parse(code)))] == [
        "failed", "ok", "interrupted", "ok", "running"]
