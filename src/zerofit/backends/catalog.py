"""The built-in engines: the names `parallel.backend` takes, and each one's config section.

The schema reads this table and nothing else about engines; an engine's own package
(`zerofit.backends.<name>`) holds everything else. A new engine adds one line here.
"""

from __future__ import annotations

from zerofit.backends.ddp.options import DDPOptions
from zerofit.backends.deepspeed.options import DeepSpeedOptions
from zerofit.backends.fsdp.options import FSDPOptions

SECTIONS: dict[str, type] = {
    "ddp": DDPOptions,
    "fsdp": FSDPOptions,
    "deepspeed": DeepSpeedOptions,
}
