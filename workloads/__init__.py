"""Models x datasets: the built-in workloads (:mod:`workloads.builtin`), the datasets and
their per-rank shards. The framework reads data through here; workloads register through
``suite.api``."""

from workloads.datasets import dataset_spec

__all__ = ["dataset_spec"]
