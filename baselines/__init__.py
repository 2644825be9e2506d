"""Baselines PruneX is measured against. Importing this package registers them."""

from baselines import ddp  # noqa: F401
