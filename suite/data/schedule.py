"""One learning-rate schedule for every method, defined on the samples a rank has consumed.

A DDP step, a PruneX local step and a local-SGD step that start at the same per-rank sample
count get the same learning rate, so methods that count iterations differently (one step,
or one round of H steps) still follow the same schedule over the same budget.

  constant  lr after the warmup
  cosine    half a cosine from lr to 0 over the samples left after the warmup
  step      lr x 0.1 at 50 % and again at 75 % of the budget (the ResNet recipe's milestones)

The warmup ramps linearly to lr over ``warmup_samples``: the step that ends at sample count
s has lr * s / warmup_samples, so the first step already moves (Goyal et al., 2017).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

SCHEDULES = ("constant", "cosine", "step")
STEP_MILESTONES = (0.5, 0.75)
STEP_FACTOR = 0.1


@dataclass(frozen=True)
class LRSchedule:
    kind: str
    base_lr: float
    warmup_samples: int
    total_samples: int

    def __post_init__(self) -> None:
        if self.kind not in SCHEDULES:
            raise ValueError(f"unknown lr schedule {self.kind!r}; choose from {SCHEDULES}")

    def lr(self, samples_before: int, batch: int) -> float:
        """The lr of the step that consumes samples ``samples_before`` .. ``+ batch``."""
        if samples_before < self.warmup_samples:
            return self.base_lr * min(1.0, (samples_before + batch) / self.warmup_samples)
        span = max(self.total_samples - self.warmup_samples, 1)
        progress = min(max(samples_before - self.warmup_samples, 0) / span, 1.0)
        if self.kind == "cosine":
            return self.base_lr * 0.5 * (1.0 + math.cos(math.pi * progress))
        if self.kind == "step":
            done = samples_before / max(self.total_samples, 1)
            return self.base_lr * STEP_FACTOR ** sum(done >= m for m in STEP_MILESTONES)
        return self.base_lr
