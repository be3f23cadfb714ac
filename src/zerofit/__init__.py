"""zerofit: FSDP2, DeepSpeed ZeRO and DDP behind one config."""

from zerofit import torchao_logs

__version__ = "0.2.0"

torchao_logs.install()  # before anything (transformers included) imports torchao
