"""A round-based method that declares local steps without RoundSettings."""

from dataclasses import dataclass

from suite.api import AT_LEAST_1, METHODS, option


@dataclass
class DiLoCoSettings:
    local_steps: int | None = option(None, "local SGD steps per round H", check=AT_LEAST_1,
                                     shown_default="one local epoch, at most 32")
    outer_lr: float = option(0.7, "outer Nesterov step")


@METHODS.register("diloco-no-rounds", "local steps without RoundSettings",
                  settings=DiLoCoSettings)
def make(ctx):
    raise AssertionError("never built: registration refuses it")
