"""``--deterministic``: the switches that make a rank's kernels repeat themselves bit for bit
(torch's reproducibility notes), set before the rank touches CUDA.

cuBLAS reads ``CUBLAS_WORKSPACE_CONFIG`` when its first handle is made, so the variable is
set before the process group forms. Deterministic algorithms are asked for with
``warn_only``: an op torch has no deterministic CUDA kernel for (its list: the backward of
adaptive pooling, ``nll_loss2d``, ``scatter_add_``, ...) warns once and runs as before,
instead of ending a run that reached it; the manifest's ``numerics`` records the switches."""

from __future__ import annotations

import os

import torch

#: cuBLAS's documented setting for reproducible results (a fixed workspace per stream)
CUBLAS_WORKSPACE = ":4096:8"


def make_kernels_deterministic() -> None:
    """Deterministic algorithms (warn only), cuDNN's deterministic and non-benchmarking
    convolution choice, and cuBLAS's fixed workspace."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE)
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
