"""Starting the ranks: on this machine (torch elastic, optionally in emulated nodes),
inside a torchrun/SLURM job, or by submitting one to SLURM."""
