"""Deprecated path of :mod:`suite.plugins.method`, kept for one release (plugins import
suite.api)."""

from suite._legacy import warn_moved
from suite.plugins.method import *  # noqa: F403
from suite.plugins.method import __all__  # noqa: F401

warn_moved("suite.method", "suite.plugins.method")
