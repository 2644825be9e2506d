"""A method whose factory raises (a missing optional dependency, found only when built)."""

from suite.api import METHODS


@METHODS.register("needs-extra", "a method whose factory raises")
def make(ctx):
    import prunex_fixture_missing_dependency  # noqa: F401  (not installed anywhere)
