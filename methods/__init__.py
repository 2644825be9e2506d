"""PruneX methods. Importing this package registers them."""

from methods import prunex  # noqa: F401
