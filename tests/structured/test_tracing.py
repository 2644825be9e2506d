"""Torch-Pruning behind one adapter (suite.structured.tracing): the installed release is in
the range pyproject.toml declares and has every symbol the adapter patches or reads, and a
release that lacks one is refused in one line naming it, before a graph is traced, instead of
tracing other channel groups without an error."""

from __future__ import annotations

import importlib.metadata
import tomllib
from pathlib import Path

import pytest
import torch
from packaging.requirements import Requirement
from torch import nn

from suite.errors import BenchError
from suite.structured import tracing
from suite.structured.groups import trace_channel_groups

REPO = Path(__file__).resolve().parents[2]


def declared_range() -> Requirement:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    found = [Requirement(r) for r in project["dependencies"]
             if Requirement(r).name == "torch-pruning"]
    assert len(found) == 1, found
    return found[0]


def test_the_installed_release_is_in_the_declared_range_and_has_what_the_adapter_needs():
    declared = declared_range()
    installed = importlib.metadata.version("torch-pruning")
    assert str(declared.specifier) and declared.specifier.contains(installed), (
        f"torch-pruning {installed} is outside {declared}")
    missing = tracing.missing_symbols()
    assert not missing, f"torch-pruning {installed} lacks what the adapter needs: {missing}"


def test_a_missing_symbol_is_named_and_refused_before_a_trace(monkeypatch):
    """A release that renamed one of the index mappings the adapter makes tolerant: named,
    and the channel groups are refused in one line rather than traced without its patch."""
    from torch_pruning.dependency import index_mapping

    tracing.patch_torch_pruning()  # patched or not, the symbol is looked up as it is now
    monkeypatch.delattr(index_mapping, "update_slice_index_mapping")
    name = "torch_pruning.dependency.index_mapping.update_slice_index_mapping"
    assert tracing.missing_symbols() == [name]
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Conv2d(4, 4, 3))
    with pytest.raises(BenchError, match=f"lacks {name}, which") as refused:
        trace_channel_groups(model, torch.zeros(1, 3, 8, 8))
    assert "\n" not in str(refused.value)


def test_a_changed_keyword_or_frame_local_is_named(monkeypatch):
    import torch_pruning as tp
    from torch_pruning.dependency import index_mapping

    def build_dependency(self, model, example_input=None, verbose=True):  # renamed keyword
        raise AssertionError("not called")

    def update_index_mapping(graph):  # maps without a local called ``node``
        for module, op in graph.module2node.items():
            del module, op

    monkeypatch.setattr(tp.DependencyGraph, "build_dependency", build_dependency)
    monkeypatch.setattr(index_mapping, "update_index_mapping", update_index_mapping)
    assert tracing.missing_symbols() == [
        "torch_pruning.DependencyGraph.build_dependency(example_inputs=)",
        "torch_pruning.dependency.index_mapping.update_index_mapping: local node"]
