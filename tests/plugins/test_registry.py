"""The registry: plugins found through entry points, and one-line errors for names it
does not know."""

import os
import subprocess
import sys

import pytest

from suite.errors import BenchError
from suite.plugins.registry import Registry

PLUGIN = """
from suite.plugins.registry import WORKLOADS
from workloads import models
from suite.data.workload import Recipe, Workload

@WORKLOADS.register("plugin-cnn", "a workload from a third-party package")
def factory():
    return Workload("plugin-cnn", "plugin", "small_cnn", "synthetic", models.small_cnn, Recipe())
"""


def test_entry_point_plugin_is_listed(tmp_path):
    (tmp_path / "benchplugin.py").write_text(PLUGIN)
    dist_info = tmp_path / "benchplugin-0.1.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: benchplugin\nVersion: 0.1\n")
    (dist_info / "entry_points.txt").write_text(
        "[prunex_bench.workloads]\nplugin-cnn = benchplugin\n"
    )
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    out = subprocess.run(
        [sys.executable, "-m", "suite.cli", "list"], capture_output=True, text=True, env=env
    )
    assert out.returncode == 0, out.stderr
    assert "plugin-cnn" in out.stdout and "third-party" in out.stdout


def test_unknown_name_lists_known_and_says_what_to_check():
    registry = Registry("method", "prunex_bench.none")
    registry._plugins_loaded = True
    registry.register("alpha", "first")(lambda: None)
    with pytest.raises(BenchError, match=r"unknown method 'alpah'; known: alpha; did you mean "
                       r"'alpha'\?$"):
        registry.get("alpah")
    with pytest.raises(BenchError) as raised:
        registry.get("qsgd")
    assert str(raised.value) == (
        "unknown method 'qsgd'; known: alpha; a plugin's method is registered once its "
        "distribution is installed here with an entry point in 'prunex_bench.none' (bench "
        "list shows what is registered)")
    registry.skipped["extras"] = "plugin 'extras' (extras) failed to load: ImportError"
    with pytest.raises(BenchError, match=r"skipped in this process: extras \(see the warning "
                       r"above; bench --strict-plugins makes it an error\)"):
        registry.get("qsgd")
