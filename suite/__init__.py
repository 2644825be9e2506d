"""prunex-bench framework. Plugins import :mod:`suite.api`; the sub-packages say their job:
plugins, cluster, structured, run, launchers, results, report, sim, commands (README: Layout)."""
