"""Which tensors H-SADMM governs, and flat views of them for bulk collectives."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from suite.api import structured_weights


@dataclass(frozen=True)
class Block:
    """One ADMM block: a parameter tensor with its own rho1, rho2 (layer-wise penalties)."""

    name: str
    shape: torch.Size
    constrained: bool  # conv weight: z_i must lie in the structured set S


def admm_blocks(model: nn.Module) -> list[Block]:
    """Conv weights are constrained (paper sec. 2.1); BN, biases and FC are dense blocks."""
    conv_weights = set(structured_weights(model))
    return [
        Block(name, p.shape, name in conv_weights)
        for name, p in model.named_parameters()
        if p.requires_grad
    ]


def averaged_buffers(model: nn.Module) -> list[str]:
    """Float buffers (BN running statistics) are model-averaged each round, not ADMM'd:
    the consensus model z needs statistics to be evaluated with."""
    return [name for name, b in model.named_buffers() if b.is_floating_point()]
