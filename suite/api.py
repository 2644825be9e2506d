"""The plugin API: everything a method or workload author imports, from this one module.

A method is a factory registered with ``@METHODS.register(name, description, settings=...)``
that builds a ``Method`` from a ``RunContext``; its options are a dataclass of
``option`` fields. It talks to the other ranks only through ``ctx.comm`` (the instrumented
``Communicator``), times its work with ``ctx.recorder.phase`` under the names of
``suite.cluster.phases`` (or one of its own, ``declare_phase``), and leaves masks,
live slices and packed inter-node exchange to ``StructuredRound``. A workload is a
factory registered with ``@WORKLOADS.register`` returning a ``Workload``. A plugin
package makes itself known through the ``prunex_bench.methods`` / ``prunex_bench.workloads``
entry points; the built-ins do the same. A script that measures the suite reduces the
repeats (seeds) of its runs with ``mean_ci``, as ``bench report`` does.

Everything here is stable across releases; anything imported from elsewhere in ``suite`` is
not.
"""

from collections.abc import Iterable

from suite.cluster import phases
from suite.cluster.comm import Communicator, flatten, nbytes, unflatten, unflatten_into
from suite.cluster.phases import declare_phase
from suite.cluster.recorder import Recorder
from suite.cluster.topology import CommGroup, Topology
from suite.compat import ddp_local_buffers
from suite.config import flag_of
from suite.data.datasets import DATASETS
from suite.data.workload import DatasetSpec, Recipe, TensorData, Workload
from suite.errors import BenchError
from suite.gate.activity import (
    crosses_nodes,
    crosses_nodes_every_round,
    prunes_across_nodes,
    reaches_keep,
    sends_fraction_of_dense,
)
from suite.plugins.method import (
    Method,
    NodeAveragingSettings,
    RoundSettings,
    RunContext,
    StepResult,
    average_buffers_for_eval,
    broadcast_initial_state,
    recalibrate_batchnorm,
)
from suite.plugins.options import AT_LEAST_1, FRACTION, POSITIVE, Check, at_least, option
from suite.plugins.registry import METHODS, WORKLOADS, Look, figure_reads
from suite.plugins.sgd import SGDBaseline
from suite.results import schema
from suite.results import stats as _stats
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
    "figure_reads",
    "option",
    "Check",
    "AT_LEAST_1",
    "FRACTION",
    "POSITIVE",
    "at_least",
    "BenchError",
    "flag_of",
    # activity checks: what a finished run must have done
    "RunView",
    "crosses_nodes",
    "crosses_nodes_every_round",
    "prunes_across_nodes",
    "reaches_keep",
    "sends_fraction_of_dense",
    # repeats of a measurement: mean and 95 % interval, as bench report and bench compare
    "mean_ci",
    # the run folder's names: a method's layer rows and summary facts use them, never strings
    "schema",
    # the method contract and what it is given
    "Method",
    "StepResult",
    "SGDBaseline",
    "RunContext",
    "RoundSettings",
    "NodeAveragingSettings",
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
    # one code on every supported torch release
    "ddp_local_buffers",
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


def mean_ci(values: Iterable[float]) -> tuple[float, float, int]:
    """Repeats (seeds) of one measurement reduced to a mean and a 95 % confidence interval,
    exactly as ``bench report`` and ``bench compare`` reduce them.

    Args:
        values: one number per repeat; None and non-finite values are left out.

    Returns:
        (mean, half-width of the two-sided 95 % Student t interval, count of the values
            used); the half-width is NaN for a single value, and no value gives (NaN, NaN, 0).

    Examples:
        ```python
        mean, half, n = mean_ci([81.2, 82.0, 81.7])  # 81.63, 1.00, 3
        ```
    """
    return _stats.mean_ci(values)
