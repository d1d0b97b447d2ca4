"""The trainer's configuration: dataclasses, and ``key=value`` overrides applied to them.

``model=tiny`` picks a named size; ``model.n_layer=4`` overrides one field of it. Keys that are
not given keep the defaults below; the resolved config is saved with every run. Only our own keys are read here:
a command line comes through auralm.training.command_line, which has other projects' spellings translated first
(auralm.guides) and hands :func:`apply` our keys, each with how it was typed.
"""

from __future__ import annotations

import dataclasses
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from auralm import tasks
from auralm.models import families
from auralm.models import registry
from auralm.models.args import ModelArgs, type_name
from auralm.parallel import strategy
from auralm.training import recipes
from auralm.errors import UserError

BACKENDS = ("auto", "nccl", "gloo")
DTYPES = ("auto", "fp32", "bf16", "fp16")

# Named model sizes: every model family declares its own (auralm/models/<family>/spec.py) and registers it
# (auralm.models.registry); this is the registry's table of them all, in the families' order.
SIZES = registry.SIZES
OPTIMIZERS = ("adamw", "adam_atan2", "adam_atan2_if_installed")  # the last: AdamW where the package is missing
PUZZLE_EMB_OPTIMIZERS = ("same", "sign_sgd")  # the puzzle embedding in the optimizer's own group, or sign-SGD
COMM_HOOKS = ("none", "bf16", "fp16", "powersgd")
COMPRESS = ("none", "bf16", "int8", "int4")  # training.diloco.compress (auralm/parallel/compress.py)

SCHEDULES = ("cosine", "linear", "constant")


@dataclass
class ModelConfig:
    """``model=NAME`` and the ``model.<key>=value`` given: the named size's args with those fields replaced
    (:func:`resolved_model`). The keys and their types are the families' (auralm.models.args, each family's
    ``spec.py``); a key the chosen model does not read is refused (auralm.models.families)."""
    name: str = "trm-tiny"  # the embedded default: TRM on medium sudoku (docs/hrm.md says why TRM)
    given: dict[str, Any] = field(default_factory=dict)  # model.<key> -> its value, as set


@dataclass
class ElasticConfig:
    """A node that stops answering during a run (cli/launch/plan/min_nodes.py and cli/launch/supervise/elastic.py read
    this; the trainer only checks it)."""
    # the nodes a run goes on with when one is lost: 0 means 1 under training.sync=diloco and every node otherwise
    # (a lost node stops the run); the launcher restarts the others from the last checkpoint, and the lost node
    # again once it answers
    min_nodes: int = 0


@dataclass
class DilocoConfig:
    """DiLoCo (training.sync=diloco): H local steps per rank, then one outer step on the averaged change."""
    inner_steps: int = 50  # H: local optimizer steps between two synchronisations
    # inner_steps=auto: rounds by time (auralm/parallel/diloco_strategy.py): a round lasts what the fastest rank took
    # for H local steps in the last one, and every rank takes the local steps it can in it (the average weighted by
    # the rows each saw); H stays the schedule's steps a round
    timed: bool = False
    # P > 1: the weights in P parts of about equal size, part p synchronised after about (p + 1)/P of each round
    # (Streaming DiLoCo's fragments: a P-th of the model on the link at a time)
    fragments: int = 1
    # the outer Nesterov SGD; None (auto, the default): chosen by the run's length (auralm/parallel/diloco.py:
    # the paper's lr 0.7 momentum 0.9 for FEW_ROUNDS rounds or more, the ranks' plain average, lr 1 momentum 0, below)
    outer_lr: float | None = None
    outer_momentum: float | None = None
    # the pseudo-gradient on the wire (auralm/parallel/compress.py): none (fp32), bf16 (half the bytes), int8 or int4
    # (quantised in blocks, the rounding's remainder carried to the next round: about a quarter and an eighth of fp32)
    compress: str = "bf16"
    overlap_steps: int = 0  # K > 0: the all-reduce travels during the next round's first K local steps
    # (Streaming DiLoCo's overlap); 0: every rank waits for it at the end of the round


@dataclass
class TrainingConfig:
    max_steps: int = 1000
    batch_size: int = 64  # per rank and micro-step; global batch = batch_size * grad_accum * world; 0: auto
    # (``training.batch_size=auto``: each rank probes the largest micro-batch that fits its memory, the ranks
    # take the smallest, and grad_accum keeps global_batch_size when given; see auralm/planning/autobatch.py)
    grad_accum: int = 1
    lr: float = 2e-3
    min_lr_ratio: float = 0.1  # the cosine ends at lr * min_lr_ratio
    schedule: str = "cosine"  # after the warmup: cosine or linear down to lr * min_lr_ratio, or constant at lr
    warmup_steps: int = 30
    weight_decay: float = 0.1
    decay_vectors: bool = False  # weight decay on vectors too (norm scales, biases), as HRM's and TRM's optimizer
    #                              decays every parameter (the recipes); false: on matrices only
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0  # 0: no clipping
    grad_checkpoint: bool = False
    dtype: str = "auto"  # auto: bf16 on CUDA where supported and on CPUs with native bf16 (AVX512-BF16, AMX), else fp32
    seed: int = 1337
    log_interval: int = 10
    eval_interval: int = 200  # 0: only at the end
    eval_batches: int = 8
    checkpoint_interval: int = 200  # 0: only at the end
    keep_last: int = 3  # plus the best by validation loss
    sample_prompt: str = ""  # lm: text to continue at each evaluation ("" = start of the validation split)
    sample_tokens: int = 32
    global_batch_size: int = 0  # >0: batch_size = global_batch_size / (grad_accum x ranks)
    # batch_size=auto: the memory (GB) a rank's process may use in all (0: what the machine, or the cgroup the
    # node runs in, has available; also HRMCTL_MEMORY_LIMIT_GB in the environment, the smaller wins)
    memory_limit_gb: float = 0
    epochs: float = 0  # >0: max_steps = epochs over the train split
    eval_every_epochs: float = 0  # >0: eval_interval in epochs
    optimizer: str = "adamw"  # or adam_atan2 (package adam-atan2-pytorch)
    puzzle_emb_lr: float | None = None  # None: lr
    puzzle_emb_weight_decay: float | None = None  # None: weight_decay
    puzzle_emb_optimizer: str = "same"  # or sign_sgd (HRM's and TRM's: lr x sign of the gradient, decoupled decay)
    augment: bool = True  # sudoku: each training batch under random validity-preserving transforms
    ema: bool = False  # evaluate and save an exponential moving average of the weights (TRM)
    ema_decay: float = 0.999
    # how the ranks share their work: ddp (every gradient every step) or diloco (see DilocoConfig)
    sync: str = "ddp"
    ddp_comm_hook: str = "none"  # ddp: gradients on the wire as bf16, fp16, or PowerSGD's low-rank factors
    powersgd_rank: int = 2  # ddp_comm_hook=powersgd: the rank of the approximation
    # each rank's share of the work: equal, auto (measured), or weights per node (node0:2,node1:1)
    balance: str = "equal"
    diloco: DilocoConfig = field(default_factory=DilocoConfig)
    elastic: ElasticConfig = field(default_factory=ElasticConfig)
    # how the model is held: ddp (every rank a whole replica) or fsdp (FSDP2: parameters, gradients and optimizer
    # state sharded over the ranks, sharded checkpoints with torch.distributed.checkpoint; see docs/trainer.md)
    parallel: str = "ddp"
    fsdp_cpu_offload: bool = False  # fsdp: the sharded parameters, gradients and optimizer state live in CPU memory
    # a fresh run whose length is not given (no max_steps, no epochs) lowers max_steps so that training and the
    # final evaluation end within this much of the trainer's start, from a probe of its step time
    # (auralm/training/budget.py): 600, 90s, 10m, 1.5h; 0 or none: no budget
    time_budget: str = "10m"


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
    step_sleep: float = 0.0  # seconds every rank sleeps each step: a slower machine (a test's run outlasts its faults)
    sleep_rank: int = -1  # the rank that sleeps step_sleep (-1: every rank)
    sleep_from_step: int = 0  # from this step on (a machine that slows mid-run)


@dataclass
class WandbConfig:
    project: str = ""  # "": no W&B; a name turns it on (package wandb, on rank 0's node)
    entity: str = ""  # "": the account's default
    mode: str = "auto"  # online, offline, or auto: WANDB_MODE, else online when api.wandb.ai answers within 1 s


@dataclass
class LoggingConfig:
    """Where rank 0's metrics go besides metrics.jsonl (auralm.training.tracking)."""
    tensorboard: bool = False  # event files in <run>/tensorboard/ (package tensorboard, on rank 0's node)
    curves: bool = True  # <run>/curves.png at the end (matplotlib, on rank 0's node: 0.8 s of CPU); false: none
    wandb: WandbConfig = field(default_factory=WandbConfig)


@dataclass
class DataConfig:
    """A text file the trainer prepares itself: on first use, auralm.data.datadir's lm
    preparation writes it into a data directory beside it (``FILE.auralm/``; in the user's cache when that
    directory is not writable), which becomes data_dir; reused while the file and these options are unchanged."""
    train_path: str = ""  # .jsonl (one {"text": ...} a line) or .txt (paragraphs); "": use data_dir
    vocab_size: int = 8192  # the byte-level BPE trained on it


@dataclass
class Config:
    task: str = "sudoku"
    data_dir: str = ""  # "": data/<task>
    out_dir: str = ""  # "": runs/<run-id>
    run_name: str = ""  # "": a time stamp; the run directory is runs/<run_name> unless out_dir is given
    resume: str = ""  # "", "latest", or a checkpoint (or run) directory
    backend: str = "auto"
    dist_timeout: int = 300  # seconds a collective may wait for a peer
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    training: TrainingConfig = field(default_factory=TrainingConfig)
    guard: GuardConfig = field(default_factory=GuardConfig)
    fault: FaultConfig = field(default_factory=FaultConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    recipe: str = ""  # a paper's training (auralm/training/recipes.py): hrm-sudoku, trm-sudoku-mlp, trm-sudoku-att
    # how the model was chosen when not by model=NAME itself ("hrm-27m (HRM) chosen from arch=hrm_v1"): said in the
    # log and by --dry-run; set by apply(), not a key
    model_choice: str = field(default="", metadata={"internal": True})
    # the recipe the run follows and what it set ("recipe trm-sudoku-mlp: ..."): set by apply(), not a key
    recipe_note: str = field(default="", metadata={"internal": True})
    # the keys of ours the overrides set (a config file's included): set by apply(), not a key
    given_keys: tuple[str, ...] = field(default=(), metadata={"internal": True})


def _keys(obj, prefix: str = "") -> dict[str, type]:
    """Every settable key with its type; a section is also settable (``model=tiny`` sets its name)."""
    out = {}
    internal = {f.name for f in dataclasses.fields(obj) if f.metadata.get("internal")}
    for name, typ in typing.get_type_hints(type(obj)).items():
        if name in internal:
            continue
        value = getattr(obj, name)
        if isinstance(value, ModelConfig):  # model=NAME, model.name, and every family's keys with their types
            out.update({prefix + name: str, f"{prefix}{name}.name": str})
            out.update({f"{prefix}{name}.{key}": typ for key, typ in registry.KEYS.items()})
        elif dataclasses.is_dataclass(value):
            if any(f.name == "name" for f in dataclasses.fields(value)):
                out[prefix + name] = str
            out.update(_keys(value, prefix + name + "."))
        else:
            out[prefix + name] = typ
    return out


def key_names() -> list[str]:
    """Every key of ours."""
    return list(_keys(Config()))


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
    optional = typing.get_origin(typ) is types.UnionType and type(None) in typing.get_args(typ)
    if optional:
        base = next(t for t in typing.get_args(typ) if t is not type(None))
        if base is not str and text.lower() in ("", "none", "null"):
            return None
        typ = base
    if typ is bool:
        low = text.lower()
        if low in ("1", "true", "yes", "on"):
            return True
        if low in ("0", "false", "no", "off"):
            return False
        raise ValueError(text)
    if typ == tuple[int, ...]:
        return parse_steps(text)
    if typing.get_origin(typ) is Literal:  # one of the values a choice takes
        if text not in typing.get_args(typ):
            raise ValueError(text)
        return text
    return typ(text)


def _type_name(typ) -> str:
    """What a key of ``typ`` expects, as a message says it (auralm.models.args.type_name, and steps)."""
    if typ in (tuple[int, ...], tuple[int, ...] | None):
        return "steps like 10,11,12 or 10-14"
    return type_name(typ)


AUTO = 0  # training.batch_size=auto, as stored (a typed 0 is refused: see _set)
AUTO_NONE = ("training.diloco.outer_lr", "training.diloco.outer_momentum")  # =auto is stored as None


def split_global_batch(fits: int, world: int, global_batch: int, grad_accum: int) -> tuple[int, int]:
    """training.batch_size=auto: (batch, grad_accum) from the largest batch every rank fits: with global_batch, the
    smallest accum such that global = batch x accum x world with batch <= fits; else (fits, grad_accum). The
    trainer's plan, and the dry run's estimate of it (cli/launch/command.py)."""
    if not global_batch:
        return fits, grad_accum
    if global_batch % world:
        raise UserError(f"global_batch_size={global_batch} does not split into {world} ranks: use a multiple of "
                        f"{world}")
    per = global_batch // world
    for accum in range(max(1, -(-per // max(1, fits))), per + 1):
        if per % accum == 0:
            return per // accum, accum
    return 1, per  # not reached: accum = per always divides


def resolve_epochs(t: TrainingConfig, world: int, n_train: int) -> int:
    """``global_batch_size``, ``epochs`` and ``eval_every_epochs`` as the batch per rank, max_steps and eval_interval
    of a world of ``world`` on ``n_train`` rows (the trainer's resolve_schedule, the dry run's time); the global
    batch a step."""
    if t.global_batch_size:
        per = t.global_batch_size // (t.grad_accum * world)
        if per < 1 or per * t.grad_accum * world != t.global_batch_size:
            raise UserError(f"global_batch_size={t.global_batch_size} does not split into {world} ranks x "
                            f"grad_accum {t.grad_accum}: use a multiple of {t.grad_accum * world}")
        t.batch_size = per
    global_batch = t.batch_size * t.grad_accum * world
    if t.epochs:
        t.max_steps = max(1, round(t.epochs * n_train / global_batch))
    if t.eval_every_epochs:
        t.eval_interval = max(1, round(t.eval_every_epochs * n_train / global_batch))
    return global_batch


@dataclass(frozen=True)
class Setting:
    """One override of ours, ``key=text``: ``typed`` is the ``key=value`` as the user typed it where that was another
    spelling (messages name it, and so does ``model_choice``: "chosen from arch=hrm_v1"); ``file`` the config file it
    comes from (its errors name the file)."""
    key: str
    text: str
    typed: str = ""
    file: str = ""

    @property
    def given(self) -> str:
        """The ``key=value`` as typed."""
        return self.typed or f"{self.key}={self.text}"


def _set(cfg: Config, keys: dict, s: Setting) -> str:
    """Set one setting; the key of ours it set (``model.name``, a config file's ``model: {name: ...}``, is ``model``)."""
    given, text = s.given.partition("=")[0], s.text
    key = "model" if s.key == "model.name" else s.key
    if key not in keys:
        raise UserError(f"unknown key {given!r} (known keys: {', '.join(sorted(keys))})")
    if key == "training.batch_size" and text.strip().lower() == "auto":
        cfg.training.batch_size = AUTO
        return key
    if key == "training.diloco.inner_steps" and text.strip().lower() == "auto":
        cfg.training.diloco.timed = True  # H keeps its value: the schedule's steps a round
        return key
    if key in AUTO_NONE and text.strip().lower() == "auto":
        text = "none"
    try:
        value = _convert(text, keys[key])
        if key == "training.batch_size" and value <= 0:
            raise UserError(f"{given}={text}: must be greater than 0 (or auto: the largest that fits)")
    except ValueError:
        what = "an integer or auto" if key in ("training.batch_size", "training.diloco.inner_steps") else \
            "a number or auto" if key in AUTO_NONE else _type_name(keys[key])
        raise UserError(f"{given}={text!r}: expected {what}") from None
    target = cfg
    *path, last = key.split(".")
    for part in path:
        target = getattr(target, part)
    if dataclasses.is_dataclass(getattr(target, last, None)):
        target, last = getattr(target, last), "name"
    if isinstance(target, ModelConfig) and last != "name":
        target.given[last] = value
    else:
        setattr(target, last, value)
    return key


def split_item(item: str) -> tuple[str, str]:
    """``key=value`` as (key, value), stripped; anything else is a UserError."""
    key, eq, text = item.partition("=")
    key, text = key.strip(), text.strip()
    if not eq or not key:
        raise UserError(f"expected key=value, got {item!r}")
    return key, text


def with_files(settings: list[Setting]) -> list[Setting]:
    """The settings with every ``config=FILE.yaml`` replaced by the file's (each naming it), put first: the command
    line wins over the files."""
    files = [Setting(key, text, file=s.text) for s in settings if s.key == "config"
             for key, text in read_config_file(s.text)]
    return files + [s for s in settings if s.key != "config"]


def apply(cfg: Config, overrides: list[str | Setting], *, model: tuple[str, str] = ("", ""),
          recipe: tuple[str, str] = ("", "")) -> Config:
    """Set ``key=value`` overrides (or settings) on ``cfg`` (in place) and check the result.

    ``config=FILE.yaml`` (any number, in order) is applied first, whatever its place among the overrides: the
    command line wins over the file. ``data.train_path`` is text, so it means ``task=lm`` unless task is given.
    ``model`` and ``recipe`` are what the line implies beyond its keys, where it gives no ``model=`` and no
    ``recipe=``: (a size, the ``key=value`` that names it) and (a recipe, how it was chosen), as
    auralm.guides.translate reads them from another project's line."""
    keys = _keys(cfg)
    given = with_files([s if isinstance(s, Setting) else Setting(*split_item(s)) for s in overrides])
    typed: dict[str, str] = {}  # our key -> the key=value that set it, as typed (the last one)
    name, how = recipes.chosen([s.text for s in given if s.key == "recipe"], recipe)
    for item in recipes.overrides(name, how) if name else ():  # first: the files and the command line win
        typed[_set(cfg, keys, Setting(*split_item(item)))] = f"recipe={name}"
    for s in given:
        try:
            typed[_set(cfg, keys, s)] = s.given
        except UserError as e:
            if s.file:
                raise UserError(f"config file {s.file}: {e}") from None
            raise
    cfg.recipe, cfg.recipe_note = name, recipes.describe(name, how) if name else ""
    if cfg.data.train_path and "task" not in typed:
        cfg.task = "lm"
    _choose_model(cfg, typed, model)
    cfg.given_keys = tuple(typed)
    check(cfg)
    return cfg


def _choose_model(cfg: Config, typed: dict[str, str], implied: tuple[str, str]) -> None:
    """The model the keys name when ``model=`` does not (``implied``, else auralm.models.families), said in
    ``cfg.model_choice``; a ``model.*`` key the model does not read is refused."""
    how = ""
    if "model" in typed:
        if typed["model"].partition("=")[2] != cfg.model.name:  # typed in other words, or set by a recipe
            how = f", chosen from {typed['model']}"
    else:
        chosen = implied if implied[0] else families.choose(SIZES, cfg.model.name, typed)
        if chosen:
            cfg.model.name, item = chosen
            how = f", chosen from {item}"
    if cfg.model.name not in SIZES:
        return  # check() names the known sizes
    task = registry.size_task(cfg.model.name)
    if task and "task" not in typed:  # a family of one task (the RLM), or a size made for one (hrm-50m: text)
        cfg.task = task
    family = families.short_title(families.family(SIZES[cfg.model.name]))
    cfg.model_choice = f"{cfg.model.name} ({family}){how}" if how else ""
    families.check(SIZES, cfg.model.name, typed, how or ("" if "model" in typed else ", the default model"))


def _yaml_text(value, where: str) -> str:
    """A YAML value as the text of ``key=value``; a list is its items joined with commas."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return ""
    if isinstance(value, (list, tuple)):
        if any(isinstance(v, (list, tuple, dict)) for v in value):
            raise UserError(f"{where}: a list of lists or mappings is not a value")
        return ",".join(_yaml_text(v, where) for v in value)
    if isinstance(value, dict):
        raise UserError(f"{where}: a mapping is not a value")
    return repr(value) if isinstance(value, float) else str(value)


def read_config_file(path: str) -> list[tuple[str, str]]:
    """``config=FILE.yaml``: its settings as ``(key, value)`` texts, the nesting joined with dots
    (``training: {optimizer: {lr: 3e-4}}`` is ``training.optimizer.lr=3e-4``; ``model: rlm-tiny`` sets the size,
    ``model: {name: rlm-tiny, mhc_flows: 4}`` the size and a field). Any problem: one UserError naming the file."""
    import yaml  # PyYAML; only a config file needs it

    file = Path(path).expanduser()
    try:
        text = file.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UserError(f"config={path}: no such file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"config={path}: cannot read it ({getattr(e, 'strerror', None) or e})") from None
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or (str(e).strip().splitlines() or ["invalid"])[0]
        raise UserError(f"config file {path}: not valid YAML{where}: {problem}") from None
    if doc is None:  # empty: nothing to set
        return []
    if not isinstance(doc, dict):
        raise UserError(f"config file {path}: expected a mapping of keys (like `training: {{batch_size: 8}}`), "
                        f"not a {type(doc).__name__}")
    out: list[tuple[str, str]] = []

    def walk(node: dict, prefix: str) -> None:
        for k, v in node.items():
            if not isinstance(k, str) or not k:
                raise UserError(f"config file {path}: key {k!r} under {prefix.rstrip('.') or 'the top'} is not a name")
            if isinstance(v, dict):
                walk(v, f"{prefix}{k}.")
            else:
                out.append((prefix + k, _yaml_text(v, f"config file {path}: {prefix}{k}")))

    walk(doc, "")
    return out


BUDGET_FORMS = "seconds (600) or a duration like 90s, 10m, 1.5h; 0 or none: no budget"
_UNITS = {"s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}


def parse_budget(text: str) -> float | None:
    """``training.time_budget`` in seconds (``600``, ``90s``, ``10m``, ``1.5h``); None for 0 or none (no budget)."""
    s = str(text).strip().lower()
    if s in ("none", "off", "null"):
        return None
    m = re.fullmatch(r"(\d+(?:\.\d*)?|\.\d+)\s*(s|m|min|h)?", s)
    if not m:
        raise UserError(f"training.time_budget={text!r}: expected {BUDGET_FORMS}")
    return float(m.group(1)) * _UNITS[m.group(2) or "s"] or None


def _one_of(key: str, value: str, allowed) -> None:
    if value not in allowed:
        raise UserError(f"{key}={value!r}: expected one of {', '.join(allowed)}")


def check(cfg: Config) -> None:
    """Values that cannot work, as a UserError naming the key."""
    _one_of("task", cfg.task, tasks.names())  # the tasks registered (auralm.tasks)
    _one_of("backend", cfg.backend, BACKENDS)
    _one_of("model", cfg.model.name, tuple(SIZES))
    _one_of("training.dtype", cfg.training.dtype, DTYPES)
    t = cfg.training
    positive = {"training.max_steps": t.max_steps, "training.batch_size": t.batch_size or 1,  # 0: auto
                "training.grad_accum": t.grad_accum, "training.lr": t.lr, "training.log_interval": t.log_interval,
                "training.eval_batches": t.eval_batches, "training.keep_last": t.keep_last,
                "dist_timeout": cfg.dist_timeout, "guard.max_bad": cfg.guard.max_bad,
                "guard.window": cfg.guard.window, "guard.snapshot_every": cfg.guard.snapshot_every,
                "guard.lr_factor": cfg.guard.lr_factor}
    non_negative = {"training.warmup_steps": t.warmup_steps, "training.weight_decay": t.weight_decay,
                    "training.grad_clip": t.grad_clip, "training.eval_interval": t.eval_interval,
                    "training.checkpoint_interval": t.checkpoint_interval, "training.sample_tokens": t.sample_tokens,
                    "training.min_lr_ratio": t.min_lr_ratio, "guard.lr_steps": cfg.guard.lr_steps,
                    "model.dropout": cfg.model.given.get("dropout", 0), "fault.nan_rank": cfg.fault.nan_rank,
                    "fault.kill_rank": cfg.fault.kill_rank, "fault.step_sleep": cfg.fault.step_sleep,
                    "training.elastic.min_nodes": t.elastic.min_nodes}
    for key, value in positive.items():
        if value <= 0:
            raise UserError(f"{key}={value}: must be greater than 0")
    for key, value in non_negative.items():
        if value < 0:
            raise UserError(f"{key}={value}: must not be negative")
    _one_of("training.optimizer", t.optimizer, OPTIMIZERS)
    _one_of("training.puzzle_emb_optimizer", t.puzzle_emb_optimizer, PUZZLE_EMB_OPTIMIZERS)
    _one_of("training.schedule", t.schedule, SCHEDULES)
    _one_of("training.sync", t.sync, strategy.names("sync"))  # the sync strategies registered (auralm.parallel)
    _one_of("training.ddp_comm_hook", t.ddp_comm_hook, COMM_HOOKS)
    _one_of("training.diloco.compress", t.diloco.compress, COMPRESS)
    for key, value in {"training.diloco.inner_steps": t.diloco.inner_steps, "training.diloco.fragments":
                       t.diloco.fragments, "training.diloco.outer_lr":
                       t.diloco.outer_lr, "training.powersgd_rank": t.powersgd_rank}.items():
        if value is not None and value <= 0:  # outer_lr None: auto
            raise UserError(f"{key}={value}: must be greater than 0")
    if not 0 <= t.diloco.overlap_steps < t.diloco.inner_steps:
        raise UserError(f"training.diloco.overlap_steps={t.diloco.overlap_steps}: must be at least 0 and less than "
                        f"training.diloco.inner_steps={t.diloco.inner_steps} (the round's all-reduce travels during "
                        f"that many of the next round's local steps)")
    if t.diloco.outer_momentum is not None and not 0 <= t.diloco.outer_momentum < 1:
        raise UserError(f"training.diloco.outer_momentum={t.diloco.outer_momentum}: must be in [0, 1)")
    _one_of("training.parallel", t.parallel, strategy.names("parallel"))
    refused = strategy.refusal(t, TrainingConfig())  # what the chosen strategy declares it cannot be combined with
    if refused:
        raise UserError(refused)
    parse_balance(t.balance)
    parse_budget(t.time_budget)
    for key, value in {"training.global_batch_size": t.global_batch_size, "training.epochs": t.epochs,
                       "training.memory_limit_gb": t.memory_limit_gb,
                       "training.eval_every_epochs": t.eval_every_epochs,
                       "training.puzzle_emb_lr": t.puzzle_emb_lr or 0,
                       "training.puzzle_emb_weight_decay": t.puzzle_emb_weight_decay or 0}.items():
        if value < 0:
            raise UserError(f"{key}={value}: must not be negative")
    if not 0 < t.ema_decay < 1:
        raise UserError(f"training.ema_decay={t.ema_decay}: must be between 0 and 1")
    for key, value in {"training.beta1": t.beta1, "training.beta2": t.beta2}.items():
        if not 0 <= value < 1:
            raise UserError(f"{key}={value}: must be in [0, 1)")
    if cfg.data.train_path:
        if Path(cfg.data.train_path).suffix not in (".jsonl", ".txt"):
            raise UserError(f"data.train_path={cfg.data.train_path}: expected a .jsonl file (one {{\"text\": ...}} a "
                            f"line) or a .txt file")
        if not tasks.get(cfg.task).tokenized:
            raise UserError(f"data.train_path is text for task=lm, not task={cfg.task}")
        if cfg.data.vocab_size < 257:
            raise UserError(f"data.vocab_size={cfg.data.vocab_size}: a byte-level BPE needs at least 257")
    check_model(cfg.task, cfg.model.name, resolved_model(cfg.model))


def check_model(task: str, name: str, arch: ModelArgs) -> None:
    """The model's values: its shape's sizes greater than 0, then its family's own checks (auralm.models)."""
    family = registry.of(task, arch)
    for key in registry.SHAPE_KEYS + family.positive:
        if key in family.keys and getattr(arch, key) <= 0:
            raise UserError(f"model.{key}={getattr(arch, key)}: must be greater than 0")
    if family.check:
        family.check(task, name, arch)
    if task not in family.tasks:
        raise UserError(f"model={name} ({family.title}) trains task={' or task='.join(family.tasks)}, not task={task}")


def parse_balance(text: str) -> str | dict[str, float]:
    """``training.balance``: "equal", "auto", or {node: weight} from ``node0:2,node1:1``."""
    if text in ("equal", "auto"):
        return text
    weights = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        node, sep, w = part.rpartition(":")
        try:
            weight = float(w)
        except ValueError:
            weight = 0.0
        if not sep or not node.strip() or not 0 < weight < float("inf"):
            raise UserError(f"training.balance={text!r}: expected equal, auto, or positive weights per node like "
                            f"node0:2,node1:1")
        weights[node.strip()] = weight
    if not weights:
        raise UserError(f"training.balance={text!r}: expected equal, auto, or weights per node like node0:2,node1:1")
    return weights


def resolved_model(m: ModelConfig) -> ModelArgs:
    """The model's args: the named size's, with the fields given replaced (each checked against its type)."""
    return SIZES[m.name].replace(**m.given)


def parse(overrides: list[str]) -> Config:
    """Our own ``key=value`` overrides as a Config (a command line, whatever its spellings: auralm.training.command_line)."""
    return apply(Config(), overrides)


def to_dict(cfg: Config) -> dict:
    """The resolved config (model shape filled in), as saved with a run."""
    d = dataclasses.asdict(cfg)
    d["model"] = {"name": cfg.model.name, **resolved_model(cfg.model).to_dict()}
    return d
