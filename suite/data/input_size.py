"""The size a model is handed its images at: the dataset's own where the model takes them,
else the smallest size it takes, decided once before any rank starts.

A model by name (``timm:fasternet_t0``) is made for ImageNet's 224 px; many run on
Fashion-MNIST's 28x28 as they are, some do not (a stem whose patches or pools need more
pixels than 28 leaves them). For those the search tries larger sizes: a 16 px grid from just
above the dataset's size up to the model's own size (``Workload.native_size``: timm's
``pretrained_cfg`` input size; 224 where the workload states none), with the smallest size its
makers state (``Workload.min_size``) tried in its place on the grid. Each try builds the model
on the meta device (shapes, no storage: a tenth of a second for an ImageNet model) and runs a
batch of two through it in eval mode; the first size that runs there and on a real CPU copy
(the confirmation) wins. The dataset's size, where it fails on the meta device, is tried on a
CPU copy before it counts as failed (a model may use an op the meta device lacks), and a model
that runs on the meta device at no size up to its own is searched again on the CPU, if it
runs there at its own size; else it is refused in one line naming why.

``--image-size`` is taken as given (the way out where the search cannot decide: a model that
runs only on a GPU). ``bench run`` (``suite.run.plan``) and ``bench inspect`` decide through
``input_size``; the run's plan carries the decision to its ranks, which never search (so no
rank decides on its own), and each rank resizes its batches where they are handed to the
model (``TensorData.resize_to``), so the data stays in memory at the dataset's size.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch

from suite.data.workload import DatasetSpec, Workload
from suite.errors import BenchError
from suite.processes import single_threaded

#: the grid the search walks (px): a 32-stride network's last maps come out whole at every
#: other point, and 48 px (GhostNetV3's smallest) is on it
SIZE_STEP = 16
#: the most sizes one search tries on a device (a wider range walks a coarser grid)
MAX_TRIES = 16
#: a model's own size where its workload states none: ImageNet's
NATIVE_SIZE = 224
#: how a model's input size was chosen
DATASET, GIVEN, FOUND = "dataset", "given", "found"


@dataclass(frozen=True)
class InputSize:
    """The side of the square images a model is handed, and how it was chosen.

    Attributes:
        dataset_side: the side the dataset's images are stored at.
        model_side: the side they are handed to the model at (resized per batch).
        chosen: ``dataset`` (the model takes the dataset's images), ``given``
            (``--image-size``) or ``found`` (the smallest size the model takes).
    """

    dataset_side: int
    model_side: int
    chosen: str

    @property
    def resized(self) -> bool:
        return self.model_side != self.dataset_side

    def describe(self, workload: str) -> str:
        """``images resized from 28x28 to 32x32 (the smallest size timm:fasternet_t0
        takes)``; empty where they are not resized."""
        if not self.resized:
            return ""
        why = (f"the smallest size {workload} takes" if self.chosen == FOUND
               else "--image-size")
        return (f"images resized from {self.dataset_side}x{self.dataset_side} to "
                f"{self.model_side}x{self.model_side} ({why})")


#: (workload and its stated sizes, the dataset's shape, given) -> the decision, once per
#: process (a sweep's cells, a simulation's layouts)
_DECIDED: dict[tuple, InputSize] = {}


def input_size(workload: Workload, spec: DatasetSpec, given: int | None = None) -> InputSize:
    """The side ``workload``'s model is handed ``spec``'s images at: ``given`` where given,
    the dataset's when the model runs there, else the smallest the search finds (see the
    module's docstring).

    Raises:
        BenchError: the model runs at no size up to its own; one line.
    """
    key = (workload.name, workload.native_size, workload.min_size, spec.in_chans,
           spec.image_size, spec.num_classes, given)
    if key not in _DECIDED:
        _DECIDED[key] = _decide(workload, spec, given)
    return _DECIDED[key]


def _decide(workload: Workload, spec: DatasetSpec, given: int | None) -> InputSize:
    side = spec.image_size
    if given is not None:  # taken as given: the escape from a search that cannot decide
        return InputSize(side, given, GIVEN)
    if not fails_everywhere(workload, spec, side):
        return InputSize(side, side, DATASET)
    native = workload.native_size or NATIVE_SIZE
    sizes = candidate_sizes(side, native, workload.min_size)
    for size in sizes:  # shapes only, each size found confirmed by a real copy
        if not failure(workload, spec, size, "meta") and not failure(workload, spec, size,
                                                                       "cpu"):
            return InputSize(side, size, FOUND)
    why = failure(workload, spec, native, "cpu") if sizes else "not larger than the data's"
    if why:
        raise BenchError(f"{workload.name} runs on no image size from {side}x{side} up to its "
                         f"own {native}x{native} (at {native}: {why}); give one it takes "
                         "(--image-size)")
    # the meta device cannot run it at its own size, a real copy can: search on the CPU
    return InputSize(side, next(size for size in sizes if not failure(workload, spec, size,
                                                                       "cpu")), FOUND)


def fails_everywhere(workload: Workload, spec: DatasetSpec, size: int) -> str | None:
    """Why the model does not run at ``size`` on the meta device nor on the CPU (the CPU's
    reason; None: it runs on one of them: the meta device's shapes, else a real copy)."""
    return failure(workload, spec, size, "meta") and failure(workload, spec, size, "cpu")


def candidate_sizes(side: int, native: int, smallest: int | None = None) -> list[int]:
    """The sizes the search tries, ascending: the ``SIZE_STEP`` grid above ``side`` (a
    coarser one where it would be over ``MAX_TRIES`` long) up to ``native``, which ends it,
    and ``smallest`` (what the model's makers state) in its place; none over ``native``."""
    step = SIZE_STEP * max(1, math.ceil((native - side) / SIZE_STEP / (MAX_TRIES - 1)))
    grid = range(step * (side // step + 1), native, step)
    sizes = {*grid, native}
    if smallest is not None and side < smallest < native:
        sizes.add(smallest)
    return sorted(size for size in sizes if side < size <= native)


@single_threaded  # a batch of two small images: a second thread only waits for a core
def failure(workload: Workload, spec: DatasetSpec, size: int, device: str) -> str | None:
    """Why ``workload``'s model, built for ``spec``'s images at ``size`` on ``device``
    (``meta``: shapes only; ``cpu``: a real copy, the global random state left as it was),
    does not run a batch of two such images in eval mode, in one line; None when it does."""
    sized = replace(spec, image_size=size)
    try:
        with torch.random.fork_rng(devices=[]), torch.device(device):
            model = workload.build_model(sized).eval()
            with torch.no_grad():
                model(torch.zeros(2, spec.in_chans, size, size))
    except Exception as exc:  # a model's build and forward raise anything
        text = str(exc).strip()
        return f"{type(exc).__name__}: {text.splitlines()[0][:160]}" if text else type(
            exc).__name__
    return None
