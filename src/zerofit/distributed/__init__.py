"""What every engine shares on a process group: the device mesh, activation checkpointing,
compilation, materialising a meta-device model, and FP8 matmuls."""
