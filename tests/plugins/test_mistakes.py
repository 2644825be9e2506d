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

from suite.api import (
    AT_LEAST_1,
    FRACTION,
    POSITIVE,
    Check,
    Look,
    RoundSettings,
    figure_reads,
    option,
)
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


def test_a_declared_figure_is_a_function_of_known_tables():
    with pytest.raises(BenchError, match="figures= takes functions fn\\(runs, out, kit"):
        fresh().register("a", "x", figures=("fig10_residuals",))(factory)
    with pytest.raises(BenchError, match="got None"):
        fresh().register("n", "x", figures=None)(factory)
    with pytest.raises(BenchError, match="figure_reads: no table layer; the tables are "
                       "iterations, evals, layers"):
        figure_reads(layer=("rho1",))

    def panel(runs, out, kit, width=None):
        return kit.Skipped("p", "P", "nothing")

    registry = fresh()
    registry.register("b", "x", figures=panel)(factory)  # one figure without a tuple
    registry.register("c", "x", figures=(panel,))(factory)
    assert registry.figures() == [panel]  # drawn once, however many declare it


def test_a_settings_field_without_option_is_refused():
    @dataclass
    class Forgot:
        gain: float = 1.0

    with pytest.raises(BenchError, match=r"Forgot.gain is a settings field without option"):
        fresh().register("forgetful", "x", settings=Forgot)(factory)


def test_an_option_may_not_take_a_flag_of_bench_run_or_of_another_method():
    @dataclass
    class Seeded:
        seed: int = option(1, "the method's own seed")

    with pytest.raises(BenchError, match=r"^method 'm-clash-run': option --seed is a flag of "
                       r"bench run and bench sweep themselves; give the option another name$"):
        fresh().register("m-clash-run", "x", settings=Seeded)(factory)

    @dataclass
    class OffDryRun:
        wet: bool = option(True, "wet", off_flag="dry-run")

    with pytest.raises(BenchError, match="option --dry-run is a flag of bench run"):
        fresh().register("wet", "x", settings=OffDryRun)(factory)

    @dataclass
    class Ratio:
        topk_ratio: float = option(0.01, "fraction sent", check=FRACTION)

    @dataclass
    class OffRatio:
        dense: bool = option(False, "send dense", off_flag="topk-ratio")

    registry = fresh()
    registry.register("topk", "x", settings=Ratio)(factory)
    with pytest.raises(BenchError, match=r"^method 'sparse': --topk-ratio is already a flag of "
                       r"'topk' \(--topk-ratio\); give yours another name$"):
        registry.register("sparse", "x", settings=OffRatio)(factory)


def test_a_default_is_type_checked_before_its_range_naming_method_and_option():
    @dataclass
    class Bits:
        qsgd_bits: int = option("8", "bits per value", check=AT_LEAST_1)

    with pytest.raises(BenchError, match=r"^method 'qsgd': the default of --qsgd-bits is '8' "
                       r"\(str\), but the option is declared INT; give a default of that type$"):
        fresh().register("qsgd", "x", settings=Bits)(factory)

    @dataclass
    class Rate:
        rate: float = option(1, "an int is a float's default too", check=POSITIVE)
        scale: float = option(True, "a bool is not", check=POSITIVE)

    with pytest.raises(BenchError, match=r"the default of --scale is True \(bool\)"):
        fresh().register("rate", "x", settings=Rate)(factory)

    @dataclass
    class Odd:
        size: int = option(4, "a check that cannot take an int",
                           check=Check(lambda v: v.startswith("x"), "a name"))

    with pytest.raises(BenchError, match=r"^method 'odd': the check of --size \(a name\) fails "
                       r"on its default 4: AttributeError"):
        fresh().register("odd", "x", settings=Odd)(factory)


def test_local_steps_are_declared_by_round_settings_only():
    @dataclass
    class Rounds:
        local_steps: int | None = option(None, "local SGD steps per round H", check=AT_LEAST_1)

    with pytest.raises(BenchError, match=r"^method 'diloco': Rounds declares --local-steps but "
                       r"does not inherit suite.api.RoundSettings"):
        fresh().register("diloco", "x", settings=Rounds)(factory)

    @dataclass
    class Inherited(RoundSettings):
        outer_lr: float = option(0.7, "outer step", check=POSITIVE)

    fresh().register("diloco", "x", settings=Inherited)(factory)


def test_a_declared_phase_colour_stands_apart_from_every_known_one():
    from suite.cluster import phases

    with pytest.raises(BenchError, match=r"^phase 'quantize': colour #EE6678 is 0.6 from #EE6677 "
                       r"of phase 'inter_allreduce' in CIELAB \(at least 10 keeps them apart"):
        phases.declare_phase("quantize", "#EE6678", communication=False)
    with pytest.raises(BenchError, match="colour 'reddish' is not a colour matplotlib knows"):
        phases.declare_phase("quantize", "reddish", communication=False)
    assert "quantize" not in phases.PHASES
    assert phases.cielab("#FFFFFF")[0] == pytest.approx(100)
    try:  # black stands apart from every built-in colour
        assert phases.declare_phase("far_phase", "#000000", communication=False) == "far_phase"
    finally:
        phases.PHASES.pop("far_phase", None)


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
    assert ("plugin 'broken' (broken) failed to load: ModuleNotFoundError: No module named"
            in warnings[0])
    assert "plugin 'twice' (twice) failed to load: method 'topk' is registered twice" in (
        warnings[1]
    )
    strict = bench("--strict-plugins", "list", env=env)
    assert strict.returncode == 2
    assert "plugin 'broken'" in one_line_error(strict)


@pytest.mark.integration  # a real run of a minute: nox -s integration
def test_mistakes_of_a_method_are_named(tmp_path):
    env = install(tmp_path, {"mistakes": PLUGIN},
                  "[prunex_bench.methods]\nmistakes = mistakes\n")
    results = tmp_path / "results"
    # one node: the world group stays inside it, so the bytes past ctx.comm are a warning
    one_node = ["--gpus", "2", "--gpus-per-node", "2", "--iterations", "2", *TINY]
    direct = bench("run", "--method", "direct-dist", *one_node, "--results-dir", results,
                   "--run-id", "direct", env=env)
    assert direct.returncode == 0, direct.stderr
    assert "direct-dist recorded no traffic on 2 ranks" in direct.stderr
    summary = json.loads((results / "direct" / "summary.json").read_text())
    assert any("ctx.comm" in line for line in summary["warnings"])
    assert any("inside nodes past ctx.comm" in line for line in summary["warnings"])
    assert summary["hidden_intra_node_bytes"] > 0 and summary["hidden_inter_node_bytes"] == 0
    # two nodes: the default group spans them, so the run fails in one line
    two_nodes = ["--gpus", "2", "--gpus-per-node", "1", "--iterations", "2", *TINY]
    crossing = bench("run", "--method", "direct-dist", *two_nodes, "--results-dir", results,
                     env=env)
    assert crossing.returncode == 1
    assert "groups that span nodes (world) past ctx.comm" in one_line_error(crossing)

    none = bench("run", "--method", "no-result", *TINY, *ONE_RANK, "--iterations", "1",
                 "--results-dir", results, "--run-id", "none", env=env)
    assert none.returncode == 1
    line = one_line_error(none)
    assert "method 'no-result': step() returned NoneType" in line and "StepResult" in line
