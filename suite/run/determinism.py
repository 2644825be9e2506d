"""``--deterministic``: the switches that make a rank's kernels repeat themselves bit for bit
(torch's reproducibility notes), set before the rank touches CUDA.

cuBLAS reads ``CUBLAS_WORKSPACE_CONFIG`` when its first handle is made, so the variable is
set before the process group forms. Deterministic algorithms are asked for with
``warn_only``: an op torch has no deterministic CUDA kernel for (its list: the backward of
adaptive pooling, ``nll_loss2d``, ``scatter_add_``, ...) warns once and runs as before,
instead of ending a run that reached it; every op that warned is recorded
(``NONDETERMINISTIC``, the summary's ``nondeterministic_ops``), so a run says whether its bits
can repeat. ``PRUNEX_STRICT_DETERMINISM=1`` (tests) makes such an op an error instead. The
manifest's ``numerics`` records the switches."""

from __future__ import annotations

import os
import warnings

import torch

from suite.environment import env_flag

#: cuBLAS's documented setting for reproducible results (a fixed workspace per stream)
CUBLAS_WORKSPACE = ":4096:8"
#: set to 1: an op without a deterministic kernel ends the run (a test's strict mode)
STRICT_VARIABLE = "PRUNEX_STRICT_DETERMINISM"
#: what torch's warning says after the op's name (at::globalContext().alertNotDeterministic)
NO_DETERMINISTIC_KERNEL = " does not have a deterministic implementation"


class NondeterministicOps:
    """The ops that warned under ``--deterministic``, in the order they first did: read from
    the warnings as they are shown (every warning is still shown as before)."""

    def __init__(self) -> None:
        self.seen: list[str] = []
        self._installed = False

    def install(self) -> None:
        if self._installed:
            return
        shown = warnings.showwarning

        def show(message, category, filename, lineno, file=None, line=None):
            text = str(message)
            if NO_DETERMINISTIC_KERNEL in text:
                op = text.split(NO_DETERMINISTIC_KERNEL)[0].strip()
                if op not in self.seen:
                    self.seen.append(op)
            shown(message, category, filename, lineno, file, line)

        warnings.showwarning = show
        warnings.filterwarnings("always", message=f".*{NO_DETERMINISTIC_KERNEL}")
        self._installed = True


NONDETERMINISTIC = NondeterministicOps()


def strict() -> bool:
    return env_flag(STRICT_VARIABLE)


def make_kernels_deterministic() -> None:
    """Deterministic algorithms (warn only, recorded; an error in strict mode), cuDNN's
    deterministic and non-benchmarking convolution choice, and cuBLAS's fixed workspace."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE)
    torch.use_deterministic_algorithms(True, warn_only=not strict())
    NONDETERMINISTIC.install()
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
