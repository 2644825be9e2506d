"""prunex-bench framework. Plugins import ``suite.api``; the sub-packages say their job:
data, plugins, cluster, structured, run, launchers, results, report, sim, commands (see
docs/architecture.md)."""
