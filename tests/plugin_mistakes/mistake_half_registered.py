"""A workload module that registers a dataset, a phase and a workload, then fails to import:
none of what it registered may stay."""

from suite.api import DATASETS, WORKLOADS, DatasetSpec, declare_phase

HALF = declare_phase("half_registered", "#004488", communication=False)


@DATASETS.register("half-dataset", DatasetSpec("half-dataset", 1, 8, 2), (64, 16))
def load(data_dir, download):
    raise AssertionError("never loaded")


@WORKLOADS.register("half-workload", "registered before its module failed")
def half():
    raise AssertionError("never built")


raise ImportError("a dependency of the second half is missing")
