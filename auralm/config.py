"""The trainer's configuration: dataclasses, and ``key=value`` overrides applied to them.

``model=tiny`` picks a named size; ``model.n_layer=4`` overrides one field of it. Keys that are
not given keep the defaults below; the resolved config is saved with every run.
"""

from __future__ import annotations

import dataclasses
import difflib
import typing
from dataclasses import dataclass, field

from auralm.errors import UserError

TASKS = ("sudoku", "lm")
BACKENDS = ("auto", "nccl", "gloo")
DTYPES = ("auto", "fp32", "bf16")

# Named model sizes: layers, heads, width, and the lm context length.
SIZES = {
    "tiny": dict(n_layer=2, n_head=2, n_embd=64, block_size=64),
    "mini": dict(n_layer=4, n_head=4, n_embd=128, block_size=128),
    "small": dict(n_layer=6, n_head=6, n_embd=384, block_size=256),
    "124m": dict(n_layer=12, n_head=12, n_embd=768, block_size=1024),
}


@dataclass
class ModelConfig:
    name: str = "mini"
    n_layer: int | None = None  # None: from the named size
    n_head: int | None = None
    n_embd: int | None = None
    block_size: int | None = None  # lm context length (sudoku always sees 81 cells)
    dropout: float = 0.0


@dataclass
class TrainingConfig:
    max_steps: int = 300
    batch_size: int = 64  # per rank and micro-step; global batch = batch_size * grad_accum * world
    grad_accum: int = 1
    lr: float = 2e-3
    min_lr_ratio: float = 0.1  # the cosine ends at lr * min_lr_ratio
    warmup_steps: int = 30
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0  # 0: no clipping
    grad_checkpoint: bool = False
    dtype: str = "auto"  # auto: bf16 on CUDA where supported, else fp32
    seed: int = 1337
    log_interval: int = 10
    eval_interval: int = 50  # 0: only at the end
    eval_batches: int = 8
    checkpoint_interval: int = 100  # 0: only at the end
    keep_last: int = 3  # plus the best by validation loss
    sample_prompt: str = ""  # lm: text to continue at each evaluation ("" = start of the validation split)
    sample_tokens: int = 32


@dataclass
class GuardConfig:
    enabled: bool = True
    max_bad: int = 3  # this many non-finite steps ...
    window: int = 50  # ... within this many steps trigger a recovery
    snapshot_every: int = 50  # rank 0 keeps the last good state in memory, refreshed this often
    lr_factor: float = 0.5  # after a recovery, lr is multiplied by this ...
    lr_steps: int = 100  # ... for this many steps


@dataclass
class FaultConfig:
    nan_at_step: tuple[int, ...] = ()  # e.g. 10,11,12 or 10-14
    nan_rank: int = 0
    # kill_rank is SIGKILLed at kill_at_step, only in a run that did not resume from a checkpoint: the
    # fault fires once, and a restart (hrmctl --max-restarts, which passes resume=latest) gets past it
    kill_at_step: tuple[int, ...] = ()
    kill_rank: int = 0


@dataclass
class Config:
    task: str = "sudoku"
    data_dir: str = ""  # "": data/<task>
    out_dir: str = ""  # "": runs/<run-id>
    resume: str = ""  # "", "latest", or a checkpoint (or run) directory
    backend: str = "auto"
    dist_timeout: int = 300  # seconds a collective may wait for a peer
    model: ModelConfig = field(default_factory=ModelConfig)
    training: TrainingConfig = field(default_factory=TrainingConfig)
    guard: GuardConfig = field(default_factory=GuardConfig)
    fault: FaultConfig = field(default_factory=FaultConfig)


def _keys(obj, prefix: str = "") -> dict[str, type]:
    """Every settable key with its type; a section is also settable (``model=tiny`` sets its name)."""
    out = {}
    for name, typ in typing.get_type_hints(type(obj)).items():
        value = getattr(obj, name)
        if dataclasses.is_dataclass(value):
            out[prefix + name] = str
            out.update(_keys(value, prefix + name + "."))
        else:
            out[prefix + name] = typ
    return out


def parse_steps(text: str) -> tuple[int, ...]:
    """``10,11,12`` or ``10-14`` or a mix, as a sorted tuple of steps; ``""`` is none."""
    steps: set[int] = set()
    for part in filter(None, (p.strip() for p in text.split(","))):
        lo, sep, hi = part.partition("-")
        a, b = int(lo), int(hi) if sep else int(lo)
        if a < 1 or b < a:
            raise ValueError(part)
        steps.update(range(a, b + 1))
    return tuple(sorted(steps))


def _convert(text: str, typ):
    if typ is bool:
        low = text.lower()
        if low in ("1", "true", "yes", "on"):
            return True
        if low in ("0", "false", "no", "off"):
            return False
        raise ValueError(text)
    if typ == (int | None):
        return None if text.lower() in ("", "none") else int(text)
    if typ == tuple[int, ...]:
        return parse_steps(text)
    return typ(text)


def _type_name(typ) -> str:
    return {bool: "true or false", int: "an integer", float: "a number", (int | None): "an integer",
            tuple[int, ...]: "steps like 10,11,12 or 10-14"}.get(typ, "a string")


def apply(cfg: Config, overrides: list[str]) -> Config:
    """Set ``key=value`` overrides on ``cfg`` (in place) and check the result."""
    keys = _keys(cfg)
    for item in overrides:
        key, eq, text = item.partition("=")
        key = key.strip()
        if not eq or not key:
            raise UserError(f"expected key=value, got {item!r}")
        if key not in keys:
            near = difflib.get_close_matches(key, list(keys), n=1, cutoff=0.5)
            hint = f" (did you mean {near[0]!r}?)" if near else f" (known keys: {', '.join(sorted(keys))})"
            raise UserError(f"unknown key {key!r}{hint}")
        try:
            value = _convert(text.strip(), keys[key])
        except ValueError:
            raise UserError(f"{key}={text!r}: expected {_type_name(keys[key])}") from None
        target = cfg
        *path, last = key.split(".")
        for part in path:
            target = getattr(target, part)
        if dataclasses.is_dataclass(getattr(target, last)):
            target, last = getattr(target, last), "name"
        setattr(target, last, value)
    check(cfg)
    return cfg


def _one_of(key: str, value: str, allowed) -> None:
    if value not in allowed:
        raise UserError(f"{key}={value!r}: expected one of {', '.join(allowed)}")


def check(cfg: Config) -> None:
    """Values that cannot work, as a UserError naming the key."""
    _one_of("task", cfg.task, TASKS)
    _one_of("backend", cfg.backend, BACKENDS)
    _one_of("model", cfg.model.name, tuple(SIZES))
    _one_of("training.dtype", cfg.training.dtype, DTYPES)
    t = cfg.training
    positive = {"training.max_steps": t.max_steps, "training.batch_size": t.batch_size,
                "training.grad_accum": t.grad_accum, "training.lr": t.lr, "training.log_interval": t.log_interval,
                "training.eval_batches": t.eval_batches, "training.keep_last": t.keep_last,
                "dist_timeout": cfg.dist_timeout, "guard.max_bad": cfg.guard.max_bad,
                "guard.window": cfg.guard.window, "guard.snapshot_every": cfg.guard.snapshot_every,
                "guard.lr_factor": cfg.guard.lr_factor}
    non_negative = {"training.warmup_steps": t.warmup_steps, "training.weight_decay": t.weight_decay,
                    "training.grad_clip": t.grad_clip, "training.eval_interval": t.eval_interval,
                    "training.checkpoint_interval": t.checkpoint_interval, "training.sample_tokens": t.sample_tokens,
                    "training.min_lr_ratio": t.min_lr_ratio, "guard.lr_steps": cfg.guard.lr_steps,
                    "model.dropout": cfg.model.dropout, "fault.nan_rank": cfg.fault.nan_rank,
                    "fault.kill_rank": cfg.fault.kill_rank}
    for key, value in positive.items():
        if value <= 0:
            raise UserError(f"{key}={value}: must be greater than 0")
    for key, value in non_negative.items():
        if value < 0:
            raise UserError(f"{key}={value}: must not be negative")
    arch = resolved_model(cfg.model)
    for key in ("n_layer", "n_head", "n_embd", "block_size"):
        if arch[key] <= 0:
            raise UserError(f"model.{key}={arch[key]}: must be greater than 0")
    if arch["n_embd"] % arch["n_head"]:
        raise UserError(f"model.n_embd={arch['n_embd']} is not a multiple of model.n_head={arch['n_head']}")


def resolved_model(m: ModelConfig) -> dict:
    """The model's shape: the named size with the explicitly set fields on top."""
    arch = dict(SIZES[m.name])
    arch.update({k: getattr(m, k) for k in arch if getattr(m, k) is not None})
    arch["dropout"] = m.dropout
    return arch


def parse(overrides: list[str]) -> Config:
    return apply(Config(), overrides)


def parse_command_line(args: list[str]) -> tuple[Config, bool]:
    """The trainer's command line, `[--check] [--resume] key=value ...` -> (config, only check it)."""
    overrides, check = [], False
    for a in args:
        if a == "--check":
            check = True
        elif a == "--resume":
            overrides.append("resume=latest")
        elif a.startswith("-"):
            raise UserError(f"unknown option {a} (options: --check, --resume; everything else is key=value)")
        else:
            overrides.append(a)
    return parse(overrides), check


def to_dict(cfg: Config) -> dict:
    """The resolved config (model shape filled in), as saved with a run."""
    d = dataclasses.asdict(cfg)
    d["model"].update(resolved_model(cfg.model))
    return d


if __name__ == "__main__":
    # `python -m auralm.config [args]`: the trainer's --check without importing torch (a fraction of a
    # second instead of seconds), which is what the launcher runs before anything starts on any node.
    import sys

    try:
        parse_command_line(sys.argv[1:])
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
