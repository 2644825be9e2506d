"""A workload whose factory needs an optional dependency that is not installed."""

from suite.api import WORKLOADS


@WORKLOADS.register("convmixer-extra", "a ConvMixer that needs a missing package")
def convmixer():
    import prunex_fixture_missing_dependency  # noqa: F401  (not installed anywhere)
