"""A method whose own phase is drawn in (almost) the colour of inter_allreduce."""

from suite.api import METHODS, declare_phase

QUANTIZE = declare_phase("quantize", "#EE6678", communication=False)


@METHODS.register("qsgd-near-colour", "a phase colour near a built-in's")
def make(ctx):
    raise AssertionError("never built: its import fails")
