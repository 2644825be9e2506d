"""Structured sparsity as framework code: masks and their projection, the model's
channel groups (Torch-Pruning), live slices, packing, the one packed exchange PruneX and
the pruning baselines share, and export of the smaller model."""
