"""`merge_user_json`: a user's DeepSpeed JSON (`parallel.deepspeed.config`) adopted into the
zerofit config before the run's config is saved (`user_json` for the table and "auto",
`user_blocks` for the optimizer and scheduler)."""

from __future__ import annotations

from zerofit.backends.deepspeed.user_blocks import adopt_optimizer, adopt_scheduler
from zerofit.backends.deepspeed.user_json import adopt_table, adoption, check_batch
from zerofit.config import Config


def merge_user_json(cfg: Config, world_size: int) -> Config:
    """Adopt a user's ds_config.json into `cfg`; a value both set differently is an error."""
    path = cfg.parallel.deepspeed.config
    if not path:
        return cfg
    a = adoption(cfg, path)
    adopt_table(a)
    adopt_optimizer(a)
    adopt_scheduler(a)
    return check_batch(a, world_size)
