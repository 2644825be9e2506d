"""prunex-bench framework: CLI, registry, runner, launchers, communicator, recorder, results."""
