"""zerofit: FSDP2, DeepSpeed ZeRO and DDP behind one config."""

__version__ = "0.1.0"
