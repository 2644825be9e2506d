"""A method whose off flag is the flag of a built-in's option (--topk-ratio)."""

from dataclasses import dataclass

from suite.api import METHODS, option


@dataclass
class FlagSettings:
    dense: bool = option(False, "send dense gradients", off_flag="topk-ratio")


@METHODS.register("m-clash-method", "a flag another method owns", settings=FlagSettings)
def make(ctx):
    raise AssertionError("never built: registration refuses it")
