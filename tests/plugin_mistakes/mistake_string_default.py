"""A method whose int option has a string default."""

from dataclasses import dataclass

from suite.api import AT_LEAST_1, METHODS, option


@dataclass
class QSGDSettings:
    qsgd_bits: int = option("8", "bits per quantized value", check=AT_LEAST_1)


@METHODS.register("qsgd-bad-default", "a string default on an int option",
                  settings=QSGDSettings)
def make(ctx):
    raise AssertionError("never built: registration refuses it")
