"""The run harness every training command shares: device and DDP, checkpoints and resume, the run directory,
the run log and its trackers, the loop, and the curves drawn from a run's metrics."""
