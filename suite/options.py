"""Deprecated path of :mod:`suite.plugins.options`, kept for one release (plugins import
suite.api)."""

from suite._legacy import warn_moved
from suite.plugins.options import *  # noqa: F403
from suite.plugins.options import __all__  # noqa: F401

warn_moved("suite.options", "suite.plugins.options")
