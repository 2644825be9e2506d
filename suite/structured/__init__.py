"""Structured sparsity as framework code: masks and their projection, the model's
channel groups (Torch-Pruning), live slices, packing, the one packed exchange PruneX and
the pruning baselines share, and export of the smaller model."""

from suite._legacy import forwarding_getattr

# ``from suite.structured import StructuredMask`` (the flat module before 0.2) still works
__getattr__ = forwarding_getattr(__name__, "suite.structured.masks")
