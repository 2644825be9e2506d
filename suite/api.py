"""The plugin API: everything a method or workload author imports, from this one module.

A method is a factory registered with ``@METHODS.register(name, description, settings=...)``
that builds a :class:`Method` from a :class:`RunContext`; its options are a dataclass of
:func:`option` fields. It talks to the other ranks only through ``ctx.comm`` (the instrumented
:class:`Communicator`), times its work with ``ctx.recorder.phase`` under the names of
:mod:`suite.cluster.phases` (or one of its own, :func:`declare_phase`), and leaves masks,
live slices and packed inter-node exchange to :class:`StructuredRound`. A workload is a
factory registered with ``@WORKLOADS.register`` returning a :class:`Workload`. A plugin
package makes itself known through the ``prunex_bench.methods`` / ``prunex_bench.workloads``
entry points; the built-ins do the same.

Everything here is stable across releases; anything imported from elsewhere in ``suite`` is
not.
"""

from suite.cluster import phases
from suite.cluster.comm import Communicator, flatten, nbytes, unflatten, unflatten_into
from suite.cluster.phases import declare_phase
from suite.cluster.recorder import Recorder
from suite.cluster.topology import CommGroup, Topology
from suite.data.datasets import DATASETS
from suite.data.workload import DatasetSpec, Recipe, TensorData, Workload
from suite.errors import BenchError
from suite.plugins.method import (
    Method,
    RoundSettings,
    RunContext,
    StepResult,
    average_buffers_for_eval,
    broadcast_initial_state,
    recalibrate_batchnorm,
)
from suite.plugins.options import AT_LEAST_1, FRACTION, POSITIVE, Check, at_least, option
from suite.plugins.registry import METHODS, WORKLOADS, Look
from suite.plugins.sgd import SGDBaseline
from suite.results.activity import (
    crosses_nodes_every_round,
    reaches_keep,
    sends_fraction_of_dense,
)
from suite.results.view import RunView
from suite.structured.masks import (
    StructuredKeepSettings,
    StructuredMask,
    apply_mask,
    keep_count,
    project,
    structured_weights,
)
from suite.structured.packing import PackingSettings
from suite.structured.round import WIRE_DTYPES, StructuredRound

__all__ = [
    # registration and options
    "METHODS",
    "WORKLOADS",
    "Look",
    "option",
    "Check",
    "AT_LEAST_1",
    "FRACTION",
    "POSITIVE",
    "at_least",
    "BenchError",
    # activity checks: what a finished run must have done
    "RunView",
    "crosses_nodes_every_round",
    "reaches_keep",
    "sends_fraction_of_dense",
    # the method contract and what it is given
    "Method",
    "StepResult",
    "SGDBaseline",
    "RunContext",
    "RoundSettings",
    "Topology",
    "CommGroup",
    "Communicator",
    "Recorder",
    "phases",
    "declare_phase",
    "average_buffers_for_eval",
    "broadcast_initial_state",
    "recalibrate_batchnorm",
    "flatten",
    "unflatten",
    "unflatten_into",
    "nbytes",
    # structured sparsity
    "StructuredRound",
    "StructuredMask",
    "StructuredKeepSettings",
    "PackingSettings",
    "WIRE_DTYPES",
    "project",
    "apply_mask",
    "keep_count",
    "structured_weights",
    # workloads and datasets
    "Workload",
    "DATASETS",
    "Recipe",
    "DatasetSpec",
    "TensorData",
]
