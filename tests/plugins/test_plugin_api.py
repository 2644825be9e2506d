"""The declared plugin API: plugins and the built-in methods import only ``suite.api``; no
method builds packing keys or issues a collective itself."""

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PLUGIN = REPO / "tests" / "plugin_example" / "benchplugin.py"
#: torch.distributed calls that move data between ranks
COLLECTIVES = {
    "all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_object", "all_to_all",
    "all_to_all_single", "broadcast", "broadcast_object_list", "reduce", "reduce_scatter",
    "reduce_scatter_tensor", "gather", "gather_object", "scatter", "scatter_object_list",
    "send", "recv", "isend", "irecv", "barrier", "all_gather_single", "monitored_barrier",
}
PACKING_PREFIXES = ("p:", "b:")


def violations(path: Path) -> list[str]:
    """What ``path`` does that only the framework may: import ``suite`` other than
    ``suite.api``, call a torch.distributed collective, or spell a packing key."""
    tree = ast.parse(path.read_text())
    found = []
    dist_names = {"torch.distributed"}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("suite"):
            if node.module != "suite.api":
                found.append(f"{path.name}:{node.lineno} imports {node.module}")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("suite") and alias.name != "suite.api":
                    found.append(f"{path.name}:{node.lineno} imports {alias.name}")
                if alias.name == "torch.distributed":
                    dist_names.add(alias.asname or alias.name)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            owner = ast.unparse(node.func.value)
            if node.func.attr in COLLECTIVES and owner in dist_names | {"dist"}:
                found.append(f"{path.name}:{node.lineno} calls {owner}.{node.func.attr}")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            if node.value.startswith(PACKING_PREFIXES):
                found.append(f"{path.name}:{node.lineno} spells packing key {node.value!r}")
        elif isinstance(node, ast.JoinedStr) and node.values:
            head = node.values[0]
            if isinstance(head, ast.Constant) and str(head.value).startswith(PACKING_PREFIXES):
                found.append(f"{path.name}:{node.lineno} builds a packing key")
    return found


def plugin_files() -> list[Path]:
    return sorted([*(REPO / "methods").rglob("*.py"), *(REPO / "baselines").rglob("*.py"), PLUGIN])


@pytest.mark.parametrize("path", plugin_files(), ids=lambda p: str(p.relative_to(REPO)))
def test_methods_talk_to_the_framework_only_through_the_api(path):
    assert violations(path) == []


def test_the_checker_sees_what_it_forbids(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text(
        "import torch.distributed as tdist\n"
        "from suite.structured.packing import PackLayout\n"
        "def f(t, n):\n"
        "    tdist.all_reduce(t)\n"
        "    return {f'p:{n}': t, 'b:running_mean': t}\n"
    )
    found = "\n".join(violations(bad))
    assert "imports suite.structured.packing" in found
    assert "calls tdist.all_reduce" in found
    assert "builds a packing key" in found
    assert "spells packing key 'b:running_mean'" in found


def test_api_declares_what_it_exports():
    import suite.api

    assert sorted(suite.api.__all__) == sorted(set(suite.api.__all__))
    for name in suite.api.__all__:
        assert hasattr(suite.api, name), name


def test_registration_declares_the_look_and_phases_their_colours():
    from suite.cluster import phases
    from suite.report.style import method_style

    assert method_style("prunex").name == "PruneX" and method_style("prunex").color == "#D55E00"
    assert method_style("not-installed").color == "#999999"
    assert phases.phase_color(phases.INTER_ALLREDUCE) == "#EE6677"
    assert phases.is_communication(phases.MASK_SYNC)
    assert not phases.is_communication(phases.DUAL_UPDATE)
    with pytest.raises(ValueError, match="already declared"):
        phases.declare_phase(phases.PACK, "#000000", communication=True)
