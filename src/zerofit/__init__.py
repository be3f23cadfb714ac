"""zerofit: FSDP2, DeepSpeed ZeRO and DDP behind one config."""

from importlib import metadata

from zerofit.report import quiet

try:
    __version__ = metadata.version("zerofit")  # one number: pyproject.toml's, as installed
except metadata.PackageNotFoundError:  # a source tree on PYTHONPATH, never installed
    __version__ = "unknown"

quiet.install()  # before anything (transformers included) imports torchao
