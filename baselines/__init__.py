"""Baselines PruneX is measured against. Importing this package registers them."""

from baselines import ddp, localsgd, powersgd, topk  # noqa: F401
