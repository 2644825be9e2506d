"""The supported torch range (suite.compat): a run on a torch that lacks every API newer than
the floor ends ok with the same results, a torch older than the floor is one line, and every
torch API the code names is on the list checked against the floor."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import tomllib

import pandas as pd
import pytest
import torch

from suite import compat
from suite.results import schema
from tests.support.runs import ENV, REPO, TINY, bench, bench_here, one_line

FLOOR_SITE = REPO / "tests" / "support" / "torch_floor"
METHODS = ("ddp", "topk", "prunex")  # topk-hier takes the same fallbacks as topk


def load_hiders() -> dict:
    spec = importlib.util.spec_from_file_location("floor_sitecustomize",
                                                  FLOOR_SITE / "sitecustomize.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # inert without PRUNEX_HIDE_TORCH_APIS
    return module.HIDERS


def as_floor(env: dict) -> dict:
    """``env`` for processes whose torch lacks every API newer than the floor."""
    path = os.pathsep.join(p for p in (str(FLOOR_SITE), env.get("PYTHONPATH")) if p)
    return {**env, "PYTHONPATH": path, "PRUNEX_HIDE_TORCH_APIS": "all"}


def test_every_newer_api_has_a_hider():
    """A newer API added to suite.compat without a way to hide it would go untested."""
    assert set(load_hiders()) == set(compat.NEWER_APIS)


def test_the_hider_removes_them_in_a_fresh_process():
    code = ("import json, suite.compat as c, torch.distributed as d; "
            "print(json.dumps([c.fallbacks(), hasattr(d, 'all_gather_single')]))")
    import subprocess

    out = subprocess.run([sys.executable, "-c", code], env=as_floor(ENV), capture_output=True,
                         text=True, check=True).stdout
    missing, has_gather = json.loads(out)
    assert missing == list(compat.NEWER_APIS) and not has_gather


@pytest.fixture(scope="module")
def floor_and_here(tmp_path_factory):
    """The same sweep twice: on this torch, and with every newer API hidden in every
    process (the ``bench`` command, the elastic agent, the ranks)."""
    roots = {}
    for name, env in (("here", ENV), ("floor", as_floor(ENV))):
        roots[name] = tmp_path_factory.mktemp(name)
        proc = bench("sweep", "--method", ",".join(METHODS), "--workload", "cnn-fmnist", *TINY,
                     "--gpus", "2", "--gpus-per-node", "1", "--iterations", "3",
                     "--local-steps", "2", "--results-dir", roots[name], env=env, timeout=600)
        assert proc.returncode == 0, proc.stdout + proc.stderr
    return roots


def runs(root) -> dict:
    return {json.loads(p.read_text())["method"]: p.parent for p in root.rglob("summary.json")}


@pytest.mark.integration  # a minute of end-to-end runs: nox -s integration
def test_runs_on_the_floor_api_end_ok_with_the_same_results(floor_and_here):
    here, floor = runs(floor_and_here["here"]), runs(floor_and_here["floor"])
    assert set(here) == set(floor) == set(METHODS)
    for method in METHODS:
        manifest = json.loads((floor[method] / "manifest.json").read_text())
        assert manifest["versions"]["torch_fallbacks"] == list(compat.NEWER_APIS), method
        assert json.loads((floor[method] / "summary.json").read_text())["status"] == "ok"
        a = pd.read_parquet(here[method] / "iterations.parquet")
        b = pd.read_parquet(floor[method] / "iterations.parquet")
        # what the clock decides is left out: times, and the store's heartbeats (one a second)
        timeless = [c for c in a.columns
                    if not re.match(r"t_|wall|time", c) and c != schema.STORE_OPS]
        pd.testing.assert_frame_equal(a[timeless], b[timeless], check_exact=True)
        models = [torch.load(run / "model.pt", weights_only=True) for run in (here[method],
                                                                               floor[method])]
        for key, value in models[0].items():
            assert torch.equal(value, models[1][key]), (method, key)


def test_a_torch_older_than_the_floor_is_one_line(monkeypatch):
    monkeypatch.setattr(torch, "__version__", "2.10.2+cu128")
    result = bench_here("list")
    assert result.exit_code == 2
    assert "torch 2.10.2+cu128 is older than 2.11" in one_line(result)


@pytest.mark.parametrize(("version", "supported"), [
    ("2.11.0+cu130", True), ("2.11.0a0+git5228986", True), ("2.14.1", True), ("3.0.0", True),
    ("2.10.1", False), ("1.13.1+cu117", False),
])
def test_the_floor_is_the_release_not_its_build(version, supported):
    """A container's build of the 2.11 branch (2.11.0a0+...) is 2.11."""
    assert (compat.unsupported_torch(version) is None) == supported


def test_pyproject_admits_the_floor():
    from packaging.requirements import Requirement

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    specs = {r.name: r for r in map(Requirement, project["dependencies"])}
    floor = ".".join(map(str, compat.FLOOR))
    assert specs["torch"].specifier.contains(f"{floor}.0", prereleases=True)
    assert not specs["torch"].specifier.contains("2.10.2")
    assert not any(s.operator in ("<", "<=", "==", "~=") for s in specs["torch"].specifier)
    assert specs["torchvision"].specifier.contains("0.26.0")  # torch 2.11's


def test_every_torch_api_the_code_names_was_checked_against_the_floor():
    """tools/torch_apis.py finds every torch name in the code; each must be on the list of
    suite.compat's docstring, which says it was checked under the floor's torch."""
    tool = torch_apis()
    listed = set()
    for parent, leaves in re.findall(r"^    (torch[\w.]*):\s+(.*?)(?=^    torch|^\n|\Z)",
                                     compat.__doc__, flags=re.M | re.S):
        listed |= {f"{parent}.{leaf.split()[0]}" for leaf in re.split(r",\s*", leaves.strip())
                   if leaf.strip()}
    used = {name for name in tool.without_prefixes(tool.uses(tool.source_files()))
            if tool.RETURNED not in name}  # methods of returned objects: checked below
    assert used - listed == set(), "check these under torch 2.11, then list them in suite.compat"
    # and this torch has them all, but for the newer ones suite.compat detects
    outside = [line for line in tool.check(tool.uses(tool.source_files()))
               if not line.endswith(f"(used in {tool.COMPAT})")]
    assert outside == []


def test_ci_and_the_readme_install_through_the_constraints():
    """This machine's pins live in constraints.txt, inside pyproject's range, and every pip
    install of the project in CI and the README passes them."""
    from packaging.requirements import Requirement

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    ranges = {r.name: r.specifier for r in map(Requirement, project["dependencies"])}
    pins = [Requirement(line) for line in (REPO / "constraints.txt").read_text().splitlines()
            if line.strip() and not line.startswith("#")]
    assert {p.name for p in pins} >= {"torch", "torchvision"}
    for pin in pins:
        (exact,) = pin.specifier
        assert exact.operator == "==" and ranges[pin.name].contains(exact.version), pin
    for path in (".ci/run", "README.md"):
        installs = [line for line in (REPO / path).read_text().splitlines()
                    if re.search(r"pip install\b.*-e ", line)]
        assert installs and all("-c constraints.txt" in line for line in installs), path


def torch_apis():
    """tools/torch_apis.py as a module (registered: its dataclasses look their module up)."""
    spec = importlib.util.spec_from_file_location("torch_apis", REPO / "tools" / "torch_apis.py")
    tool = importlib.util.module_from_spec(spec)
    sys.modules["torch_apis"] = tool
    spec.loader.exec_module(tool)
    return tool


def test_the_api_check_lists_every_fallback_the_floor_would_use():
    """Under the floor's look-alike (tests/support/torch_floor) the check finds each API of
    suite.compat's NEWER_APIS, those passed through ``**`` included, and nothing else."""
    env = {**os.environ, "PRUNEX_HIDE_TORCH_APIS": "all",
           "PYTHONPATH": str(REPO / "tests" / "support" / "torch_floor")}
    proc = subprocess.run([sys.executable, "tools/torch_apis.py"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr  # every one reached through compat
    missing = [line.strip() for line in proc.stdout.splitlines()[1:]]
    assert len(missing) == len(compat.NEWER_APIS), proc.stdout
    for api in compat.NEWER_APIS:
        owner, _, leaf = api.rpartition(".")
        assert any(line.startswith((api + ":", f"{owner}({leaf}=)")) for line in missing), api


def test_keywords_through_stars_and_methods_of_returned_objects_are_checked(tmp_path):
    source = tmp_path / "planted.py"
    source.write_text(
        "import torch\n"
        "def settings(**extra):\n"
        "    extra['bogus_width'] = 3\n"
        "    return torch.nn.Linear(2, 2, **extra)\n"
        "def flags():\n"
        "    return {'device': 'cpu'} if True else {'no_such_flag': 1}\n"
        "def build():\n"
        "    settings(bogus_depth=2)\n"
        "    layer = torch.nn.Linear(2, 2, **flags())\n"
        "    layer.not_a_method()\n"
        "    return torch.nn.Linear(2, 2).weight\n")
    tool = torch_apis()
    problems = tool.check(tool.uses([source]))
    assert any("Linear(bogus_depth=, bogus_width=, no_such_flag=)" in p for p in problems), problems
    assert any(p.startswith("torch.nn.Linear().not_a_method: ") for p in problems), problems
    assert not any("weight" in p or "(device=" in p for p in problems)
