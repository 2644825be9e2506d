"""Baselines PruneX is measured against. Importing this package registers them."""

from baselines import ddp, localsgd, powersgd, pruning, topk  # noqa: F401
