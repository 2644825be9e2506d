"""One rank's run: its configuration, building the method, the training loop,
evaluation, checkpoints, the lr schedule, stopping on signals and live logs."""
