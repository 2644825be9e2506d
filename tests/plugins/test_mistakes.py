"""The mistakes plugin authors make, each caught where it is made, in one line: at
registration (defaults outside their range, a flag two methods declare differently, a look
matplotlib cannot draw, a settings field that is not an option, a name taken twice), at a
phase's first use, at a step's return, before any rank starts, and a plugin that fails to
load, which is skipped while everything else keeps working."""

from __future__ import annotations

import json
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import pytest
import torch

from suite.api import FRACTION, POSITIVE, Look, option
from suite.cluster.recorder import Recorder
from suite.errors import BenchError
from suite.plugins.registry import Registry
from tests.support.runs import ENV, ONE_RANK, TINY, bench, one_line_error


def fresh() -> Registry:
    """A registry with no entry points of its own (the built-ins stay untouched)."""
    registry = Registry("method", "prunex_bench.none")
    registry._plugins_loaded = True
    return registry


def factory(ctx):
    return None


def test_a_default_outside_its_own_range_is_refused():
    @dataclass
    class Gain:
        gain: float = option(0.0, "gain applied to the update", check=POSITIVE)

    with pytest.raises(BenchError, match=r"'efsign': the default of --gain is invalid .*positive"):
        fresh().register("efsign", "sign SGD", settings=Gain)(factory)

    @dataclass
    class Choice:
        mode: Literal["a", "b"] = option("c", "how")  # a default that is not a choice

    with pytest.raises(BenchError, match="--mode must be one of a, b, got 'c'"):
        fresh().register("chooser", "x", settings=Choice)(factory)


def test_a_flag_declared_by_two_methods_must_mean_one_thing():
    @dataclass
    class TopK:
        topk_ratio: float = option(0.01, "fraction sent", check=FRACTION)

    @dataclass
    class Other:
        topk_ratio: float = option(0.5, "another meaning", check=FRACTION)

    registry = fresh()
    registry.register("topk", "x", settings=TopK)(factory)
    registry.register("topk-too", "x", settings=TopK)(factory)  # the same declaration: fine
    with pytest.raises(BenchError) as raised:
        registry.register("efsign", "x", settings=Other)(factory)
    message = str(raised.value)
    assert "'efsign' declares --topk-ratio" in message and "'topk' declares it" in message
    assert "0.5" in message and "0.01" in message and "another name" in message


def test_a_look_is_one_matplotlib_can_draw():
    with pytest.raises(BenchError, match="colour 'reddish' is not a colour"):
        fresh().register("a", "x", look=Look("A", "reddish", "o"))(factory)
    with pytest.raises(BenchError, match="marker 'star' is not a matplotlib marker"):
        fresh().register("b", "x", look=Look("B", "#D55E00", "star"))(factory)
    fresh().register("c", "x", look=Look("C", "tab:blue", "d"))(factory)


def test_a_settings_field_without_option_is_refused():
    @dataclass
    class Forgot:
        gain: float = 1.0

    with pytest.raises(BenchError, match=r"Forgot.gain is a settings field without option"):
        fresh().register("forgetful", "x", settings=Forgot)(factory)


def test_a_name_registered_twice_is_refused():
    registry = fresh()
    registry.register("a", "x")(factory)
    with pytest.raises(BenchError, match="method 'a' is registered twice"):
        registry.register("a", "y")(lambda ctx: None)


def test_an_unknown_phase_fails_at_its_first_use():
    recorder = Recorder(0, torch.device("cpu"))
    recorder.begin_iteration(0)
    with pytest.raises(BenchError, match="unknown phase 'alreduce'; did you mean 'allreduce'"):
        with recorder.phase("alreduce"):
            pass
    with pytest.raises(BenchError, match="declare_phase"):
        recorder.add_time("not a phase", 1.0)


PLUGIN = '''
import torch
import torch.distributed as dist
from torch import nn

from suite.api import METHODS, Method, StepResult, broadcast_initial_state


class Direct(Method):
    """Averages gradients with torch.distributed directly (past ctx.comm)."""

    def __init__(self, ctx):
        self.ctx, self.model = ctx, ctx.model
        broadcast_initial_state(self.model)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=ctx.recipe.lr)
        self.batches = iter(ctx.loader)

    def step(self, iteration):
        x, y = next(self.batches)
        self.optimizer.zero_grad()
        loss = nn.functional.cross_entropy(self.model(x), y)
        loss.backward()
        for p in self.model.parameters():
            dist.all_reduce(p.grad)
        self.optimizer.step()
        return RESULT(loss.item(), len(y))

    def eval_model(self):
        return self.model

    def state_dict(self):
        return {}

    def load_state_dict(self, state):
        pass


RESULT = StepResult


@METHODS.register("direct-dist", "all-reduces with torch.distributed directly")
def make_direct(ctx):
    return Direct(ctx)


class NoResult(Direct):
    def step(self, iteration):
        super().step(iteration)
        return None


@METHODS.register("no-result", "a step that returns None")
def make_no_result(ctx):
    return NoResult(ctx)
'''


def install(tmp_path: Path, modules: dict[str, str], entry_points: str) -> dict:
    """Plugin modules as a real installed distribution (dist-info with entry points)."""
    for name, text in modules.items():
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(text))
    dist_info = tmp_path / "mistakes-0.1.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: mistakes\nVersion: 0.1\n")
    (dist_info / "entry_points.txt").write_text(entry_points)
    return {**ENV, "PYTHONPATH": str(tmp_path)}


def test_a_plugin_that_fails_to_load_is_skipped_and_the_rest_works(tmp_path):
    env = install(
        tmp_path,
        {"broken": "import not_installed_anywhere\n",
         "twice": "from suite.api import METHODS\n"
                  "@METHODS.register('topk', 'a second topk')\ndef make(ctx):\n    return None\n"},
        "[prunex_bench.methods]\nbroken = broken\ntwice = twice\n",
    )
    listed = bench("list", env=env)
    assert listed.returncode == 0, listed.stderr
    assert "prunex" in listed.stdout and "a second topk" not in listed.stdout
    warnings = listed.stderr.strip().splitlines()
    assert len(warnings) == 2, listed.stderr
    assert "plugin 'broken' (broken) failed to load: No module named" in warnings[0]
    assert "plugin 'twice' (twice) failed to load: method 'topk' is registered twice" in (
        warnings[1]
    )
    strict = bench("--strict-plugins", "list", env=env)
    assert strict.returncode == 2
    assert "plugin 'broken'" in one_line_error(strict)


def test_mistakes_of_a_method_are_named(tmp_path):
    env = install(tmp_path, {"mistakes": PLUGIN},
                  "[prunex_bench.methods]\nmistakes = mistakes\n")
    results = tmp_path / "results"
    two = ["--gpus", "2", "--gpus-per-node", "1", "--iterations", "2", *TINY]
    direct = bench("run", "--method", "direct-dist", *two, "--results-dir", results,
                   "--run-id", "direct", env=env)
    assert direct.returncode == 0, direct.stderr
    assert "direct-dist recorded no traffic on 2 ranks" in direct.stderr
    summary = json.loads((results / "direct" / "summary.json").read_text())
    assert any("ctx.comm" in line for line in summary["warnings"])

    none = bench("run", "--method", "no-result", *TINY, *ONE_RANK, "--iterations", "1",
                 "--results-dir", results, "--run-id", "none", env=env)
    assert none.returncode == 1
    line = one_line_error(none)
    assert "method 'no-result': step() returned NoneType" in line and "StepResult" in line
