"""A user's DeepSpeed JSON adopted into the zerofit config, "auto" read as HF Trainer reads it.

HF Trainer (`HfTrainerDeepSpeedConfig.trainer_config_process` / `trainer_config_finalize` in
transformers' integrations/deepspeed.py) replaces each "auto" with its own setting: micro-batch,
accumulation, train_batch_size (world x micro x accumulation), gradient_clipping, the optimizer's
lr, betas, eps and weight_decay, fp16/bf16 from its precision, reduce_bucket_size = hidden²,
and at ZeRO-3 stage3_prefetch_bucket_size = 0.9 x hidden² and stage3_param_persistence_threshold
= 10 x hidden (left "auto" below stage 3, which DeepSpeed drops for its default); a value that is
not "auto" must match its setting. zerofit does the same from its own config, with two
differences: a value not "auto" is adopted where the zerofit config leaves the field at its
default (a conflict only where the config sets it), and an "auto" at any other path zerofit maps
(`ds_json.TABLE`) takes the zerofit field's value. The hidden-size rules apply where the zerofit
config leaves the bucket sizes at their defaults.

Here the file's values become the config's (`merge.merge_user_json`, in the launcher, before the run's
config is saved); `fill.fill_json` then writes the config's values into the file's "auto"s and
gaps. The optimizer and scheduler blocks: `user_blocks`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from zerofit.backends.deepspeed.ds_json import SKIP, TABLE, Row, read_user_json
from zerofit.backends.deepspeed.json_paths import AUTO, MISSING, both_spellings, get, locate, shown
from zerofit.config import Config, explicit_keys, get_field, with_fields
from zerofit.config.limits import shown as shown_path
from zerofit.errors import UserError

_Z = "zero_optimization."
HIDDEN_AUTO: dict[str, Callable[[int], int]] = {  # HF's trainer_config_finalize
    _Z + "reduce_bucket_size": lambda h: h * h,
    _Z + "stage3_prefetch_bucket_size": lambda h: int(0.9 * h * h),
    _Z + "stage3_param_persistence_threshold": lambda h: 10 * h,
}
STAGE3_AUTO = {_Z + "stage3_prefetch_bucket_size", _Z + "stage3_param_persistence_threshold"}
DTYPE_FLAGS = {  # path -> (zerofit field, the dtype `true` means)
    "fp16.enabled": ("precision.param_dtype", "fp16"),
    "bf16.enabled": ("precision.param_dtype", "bf16"),
    "bf16.bf16_master_weights_and_grads": ("precision.master_dtype", "bf16"),
    "bf16.bf16_optimizer_states": ("precision.master_dtype", "bf16"),
}


def is_auto(value: Any) -> bool:
    return isinstance(value, str) and value == AUTO


@dataclass
class Adoption:
    """The values a user's file gives the zerofit config, and which key gave each."""

    cfg: Config
    user: dict[str, Any]
    file: str  # the file, as error lines name it
    explicit: frozenset[str]
    updates: dict[str, Any] = field(default_factory=dict)
    source: dict[str, str] = field(default_factory=dict)  # zerofit field -> 'key=value'

    def current(self, name: str) -> Any:
        return self.updates.get(name, get_field(self.cfg, name))

    def adopt(self, name: str, value: Any, key: str, raw: Any, hint: str = "") -> None:
        """Take `value` for zerofit field `name` from the file's `key`; refuse a disagreement with
        the config (where it sets the field) or with another key of the file."""
        current = self.current(name)
        if value != current and name in self.source:
            raise UserError(
                f"{self.source[name]} and {key}={shown(raw)} in {self.file} disagree "
                f"(both set {name}){hint}"
            )
        if value != current and name in self.explicit:
            raise UserError(
                f"{name}={current!r} in the config but {key}={shown(raw)} in {self.file}; set "
                f'{key} to "auto" to take the config\'s value, or drop {name}{hint}'
            )
        self.updates[name] = value
        self.source[name] = f"{key}={shown(raw)}"

    def default(self, name: str, value: Any, why: str) -> None:
        """Take DeepSpeed's default for a zerofit field the file leaves to it; refuse where the
        config sets the field to something else."""
        if name in self.explicit and self.current(name) != value:
            raise UserError(f"{name}={self.current(name)!r} in the config but {why}")
        self.updates[name] = value


def adoption(cfg: Config, path: str) -> Adoption:
    """The file read and checked as a whole, nothing adopted yet. `precision.mode` set (not
    "auto": see `zerofit.launch.resolve`) fixes the compute dtype as `param_dtype` would."""
    user = read_user_json(path)
    explicit = set(explicit_keys(cfg))
    if "precision.mode" in explicit:
        explicit.add("precision.param_dtype")
    a = Adoption(cfg, user, shown_path(path, quote=False), frozenset(explicit))
    _check_whole(a)
    return a


def _check_whole(a: Adoption) -> None:
    """What no single key shows: a key under both spellings, DeepSpeed's old name for bf16, both
    compute dtypes switched on."""
    for alias, name in both_spellings(a.user):
        raise UserError(
            f"zero_optimization.{name} and zero_optimization.{alias} in {a.file} are one "
            "DeepSpeed setting written twice; keep one"
        )
    if "bfloat16" in a.user:
        raise UserError(f"bfloat16 in {a.file} is DeepSpeed's old name for bf16; rename it bf16")
    fp16, bf16 = get(a.user, "fp16.enabled"), get(a.user, "bf16.enabled")
    if fp16 is True and bf16 is True:
        raise UserError(
            f"fp16.enabled=true and bf16.enabled=true in {a.file}: DeepSpeed computes in one of "
            'them; set the other to false (or both to "auto", for precision.mode to decide)'
        )


def adopt_table(a: Adoption) -> None:
    """Every TABLE path the file gives: "auto" by HF's rules, any other value adopted."""
    hidden: list[int] = []  # the model's hidden size, read once if an "auto" needs it
    for row in TABLE:
        raw = get(a.user, row.path)
        if raw is MISSING:
            continue
        key = locate(a.user, row.path) or row.path
        if is_auto(raw):
            _adopt_auto(a, row, hidden)
            continue
        try:
            value = row.from_ds(raw)
        except (TypeError, ValueError, OverflowError):
            raise UserError(f"{key}={shown(raw)} in {a.file} is not valid") from None
        if value is not SKIP:
            a.adopt(row.field, value, key, raw)
    _adopt_flags_off(a)


def _adopt_auto(a: Adoption, row: Row, hidden: list[int]) -> None:
    """HF's hidden-size rules where the config leaves the field at its default; otherwise the
    config's value fills the "auto" as it is (nothing to adopt)."""
    rule = HIDDEN_AUTO.get(row.path)
    if rule is None or row.field in a.explicit:
        return
    if row.path in STAGE3_AUTO and a.current("parallel.deepspeed.stage") != 3:
        return  # HF fills these at ZeRO-3 only; DeepSpeed ignores "auto" (its default)
    if not hidden:
        from zerofit.models.shape import shape_from_config  # a model-folder read: only if needed

        hidden.append(shape_from_config(a.cfg).dim)
    a.updates[row.field] = rule(hidden[0])


def _adopt_flags_off(a: Adoption) -> None:
    """`"enabled": false` (not "auto") for the dtype the config computes in: DeepSpeed would run
    without it, so the config follows the file (fp32), or, where the config sets it, refuses."""
    for path, (name, dtype) in DTYPE_FLAGS.items():
        raw = get(a.user, path)
        if raw is False and a.current(name) == dtype:
            key = locate(a.user, path) or path
            if name in a.source:  # another key of the file chose this dtype
                raise UserError(f"{a.source[name]} and {key}=false in {a.file} disagree")
            a.adopt(name, "fp32", key, raw)


def check_batch(a: Adoption, world: int) -> Config:
    """train_batch_size must equal micro x accum x world; as DeepSpeed does, the one of micro and
    accum that neither the file nor the config gives is derived from it. Returns the config with
    every adopted value."""
    cfg = _with_updates(a)
    total = get(a.user, "train_batch_size")
    if total is MISSING or is_auto(total):
        return cfg
    try:
        total = int(total)
    except (TypeError, ValueError, OverflowError):
        raise UserError(f"train_batch_size={shown(total)} in {a.file} is not valid") from None
    known = a.explicit | set(a.updates)
    for name, other in (
        ("micro_batch_size", "grad_accum_steps"),
        ("grad_accum_steps", "micro_batch_size"),
    ):
        if f"train.{name}" not in known:
            per, rem = divmod(total, getattr(cfg.train, other) * world)
            if rem or per < 1:
                raise UserError(
                    f"train_batch_size={total} in {a.file} is not divisible by "
                    f"{other}={getattr(cfg.train, other)} x world size={world}"
                )
            cfg = with_fields(cfg, {f"train.{name}": per})
            break
    t = cfg.train
    expected = t.micro_batch_size * t.grad_accum_steps * world
    if total != expected:
        raise UserError(
            f"train_batch_size={total} in {a.file} but micro_batch_size={t.micro_batch_size} x "
            f"grad_accum_steps={t.grad_accum_steps} x world size={world} = {expected}; set it "
            'to "auto"'
        )
    return cfg


def _with_updates(a: Adoption) -> Config:
    """The config with the adopted values; a value the config's schema refuses is named by the
    file's key that gave it."""
    updates = dict(a.updates)
    if "precision.param_dtype" in updates and "precision.mode" not in a.explicit:
        updates["precision.mode"] = updates["precision.param_dtype"]
    try:
        return with_fields(a.cfg, updates) if updates else a.cfg
    except UserError as e:
        culprit = next((a.source[n] for n in a.source if str(e).startswith(n)), None)
        if culprit is None:
            raise
        raise UserError(f"{culprit} in {a.file}: {e}") from None
