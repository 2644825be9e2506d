"""prunex-bench framework. Plugins import :mod:`suite.api`; the sub-packages say their job:
plugins, cluster, structured, run, launchers, results, report, sim, commands (README: Layout)."""

import sys

from suite._legacy import MovedModuleFinder

if not any(isinstance(finder, MovedModuleFinder) for finder in sys.meta_path):
    sys.meta_path.append(MovedModuleFinder())  # old flat module paths, for one release
