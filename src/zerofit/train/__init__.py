"""One worker's training: its entry point, the parts a run is built from, the loop and what runs
beside it (evaluation, checkpoints, logging), and the learning-rate schedule."""
