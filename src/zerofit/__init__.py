"""zerofit: FSDP2, DeepSpeed ZeRO and DDP behind one config."""

__version__ = "0.2.0"
