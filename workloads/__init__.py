"""The built-in workload plugin: models (``workloads.models``: timm and a small CNN) and
the workloads registered from them (``workloads.builtin``, named as a
``prunex_bench.workloads`` entry point like any third-party package). Datasets, shards and the
workload contract are the framework's data layer, ``suite.data``."""
