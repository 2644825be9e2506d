"""A method whose options are called like flags of bench run itself (--seed, --lr)."""

from dataclasses import dataclass

from suite.api import METHODS, POSITIVE, option


@dataclass
class ClashSettings:
    seed: int = option(1, "the method's own seed")
    lr: float = option(0.1, "the method's own lr", check=POSITIVE)


@METHODS.register("m-clash-run", "options named like run flags", settings=ClashSettings)
def make(ctx):
    raise AssertionError("never built: registration refuses it")
