"""The model families by name: each declares itself once, as a :class:`ModelFamily` in its folder's ``spec.py``
(``auralm/models/hrm/spec.py``), and is registered here; nothing else in auralm tests a family's name.

A family says: what its model reads (``args``, a frozen dataclass of auralm.models.args.ModelArgs: its keys, their
types and defaults), its named sizes (``model=NAME``: instances of it), the tasks it trains, how to build its model,
the class that build makes (what ``from_pretrained`` checks a checkpoint against), what its values must satisfy
beyond their types (``config.check``), how many blocks autograd keeps per step (``auralm.planning.sizing``'s memory
estimate, which batch_size=auto and the launcher's memory preflight use), how many forward passes a step costs
(``auralm.planning.link_budget``'s compute; what a step sends is its trainable parameters, counted on the meta device by
:meth:`ModelFamily.sent_shapes`), and what ``validate-model`` checks beyond the common checks.

What ``build`` makes: an ``nn.Module`` with ``forward(x, y=None) -> (logits, loss)`` (the trainer's plain step;
a model with ``recurrent = True`` is run as the ACT models are, auralm.training.objective: ``initial_carry``,
``loss`` with its metrics and ``summarize`` of their sums for the log line, as auralm.models.act.ACT has them),
``set_grad_checkpointing(on)`` (``training.grad_checkpoint``), optionally ``step_figures(step)`` (its own figures
for each log line: RLM's mHC amax), and the :class:`auralm.models.pretrained.Pretrained` mixin (save_pretrained,
from_pretrained); :func:`auralm.models.build` attaches its ``config``.

The built-in families are the modules in :data:`BUILTIN`; more are imported from the module paths in the
environment variable ``AURALM_MODEL_PLUGINS`` (comma-separated, e.g. ``tests.toy_family``), each of which calls
:func:`register` (or registers what else it adds, with the registry of its kind: a task, ``tests.toy_task``; a sync
mode, ``tests.toy_sync``). The variable is read in every process that reads a config: hrmctl's preflight and the
trainer under torchrun inherit it from ``hrmctl train``'s environment on this machine (a remote node needs the module
installed and the variable in its own environment). No torch here: ``auralm.training.config`` reads the sizes without
it; a family's ``build`` imports its model when called.
"""

from __future__ import annotations

import importlib
import os
import sys
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable

from auralm.models.args import ModelArgs, field_types

PLUGINS_ENV = "AURALM_MODEL_PLUGINS"
BUILTIN = ("auralm.models.gpt.spec", "auralm.models.transformer.spec", "auralm.models.hrm.spec",
           "auralm.models.trm.spec", "auralm.models.rlm.spec")
SHAPE_KEYS = ("n_layer", "n_head", "n_embd", "block_size")  # greater than 0 wherever a size has them


def _n_layer(arch: ModelArgs) -> int:
    return arch.n_layer


def _one_pass(arch: ModelArgs) -> float:
    return 1.0


@dataclass(frozen=True)
class ModelFamily:
    name: str  # as checkpoints (config.yaml's "family"), logs and its args (their class's ``family``) name it
    title: str  # in messages: "HRM"
    args: type  # what its model reads: a frozen dataclass subclassing ModelArgs, its family's name in ``family``
    sizes: dict[str, ModelArgs]  # model=NAME -> its args
    build: Callable[[str, ModelArgs, int | None], Any]  # (task, arch, vocab) -> the model (imports torch when called)
    model_class: Callable[[str, ModelArgs], type]  # the class build makes: from_pretrained's check of a checkpoint
    tasks: tuple[str, ...] = ("sudoku", "lm")
    # builds the plain sizes (args whose class names no family) on its tasks (GPT on lm and the sudoku transformer
    # share them)
    plain: bool = False
    select: str = ""  # the model= that selects it, in messages ("model=hrm-tiny (or arch=hrm_v1)")
    smallest: str = ""  # the size its own model.* keys pick when no model= is given (""): its first size
    positive: tuple[str, ...] = ()  # keys beyond SHAPE_KEYS that must be greater than 0
    check: Callable[[str, str, ModelArgs], None] | None = None  # (task, size name, arch): UserError for what cannot
    #                                                              work
    blocks_in_graph: Callable[[ModelArgs], int] = _n_layer  # blocks whose activations autograd keeps for one step
    passes: Callable[[ModelArgs], float] = _one_pass  # forward-pass equivalents of one step, a backward counting two
    validates: bool = False  # validate-model takes it (a language model: (x, y) -> (logits, loss))
    validate_checks: Callable[[Any, bool], list] | None = None  # (model, trained) -> its own validate-model checks
    # the task a size trains when the line gives no task= (HRM's hrm-50m and hrm-100m: language models); a size not
    # named here trains the config's default task
    size_task: dict = None

    def __post_init__(self):
        if not self.smallest and self.sizes:  # its first size, unless it says
            object.__setattr__(self, "smallest", next(iter(self.sizes)))
        if self.size_task is None:
            object.__setattr__(self, "size_task", {})
        for name, task in self.size_task.items():
            if name not in self.sizes or task not in self.tasks:
                raise ValueError(f"model family {self.name!r}: size_task {name}={task} names no size or task of it")
        if not (isinstance(self.args, type) and issubclass(self.args, ModelArgs)):
            raise ValueError(f"model family {self.name!r}: args must be a dataclass subclassing "
                             f"auralm.models.args.ModelArgs")
        if self.args.family != ("" if self.plain else self.name):
            raise ValueError(f"model family {self.name!r}: its args' class must say family = "
                             f"{'' if self.plain else self.name!r} (a plain family's: \"\")")

    @property
    def keys(self) -> dict[str, Any]:
        """The keys its model reads (``model.<key>``), with their types."""
        return field_types(self.args)

    def sent_shapes(self, task: str, arch: ModelArgs, vocab: int | None) -> list[tuple[int, ...]]:
        """The shape of every trainable parameter in the model's order (a tied weight once): what a DDP step
        all-reduces and a DiLoCo round averages. Built on the meta device: nothing allocated."""
        with on_meta():
            model = self.build(task, arch, vocab)
        return [tuple(p.shape) for p in model.parameters() if p.requires_grad]


# In-place fills an initialiser makes (nn.init and the models' own): shape-preserving, so skipped on meta tensors.
_FILLS = frozenset({"normal_", "uniform_", "trunc_normal_", "fill_", "zero_", "copy_", "erfinv_", "mul_", "add_",
                    "sub_", "div_", "clamp_", "clamp_min_", "clamp_max_", "exponential_", "bernoulli_", "random_"})


# Factories whose values a meta tensor does not hold, and the shape each makes from its plain-number arguments:
# on meta, made as torch.empty of that shape (a C++ meta kernel).
_FACTORIES = {
    "randn": lambda *size: size[0] if len(size) == 1 and isinstance(size[0], (tuple, list)) else size,
    "rand": lambda *size: size[0] if len(size) == 1 and isinstance(size[0], (tuple, list)) else size,
    "eye": lambda n, m=None: (n, n if m is None else m),
}


@contextmanager
def on_meta():
    """Modules built inside have their shapes and no memory (the meta device), and their initialisers' fills are
    skipped: on a meta tensor a fill such as ``normal_`` runs torch's Python reference kernel, whose first call
    imports torch._dynamo (3 s of a 6 s size estimate on the 2-core lab, for values that do not exist). So are
    the factories ``randn``, ``rand`` and ``eye`` (through torch.device's mode: ``torch.eye(n)`` was 1.4 s of
    rlm-small's 2.9 s estimate): they are made as empty tensors of their shape."""
    import torch
    from torch.overrides import TorchFunctionMode

    class SkipFills(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            name = getattr(func, "__name__", "")
            filled = args[0] if args else kwargs.get("tensor")  # nn.init passes it by name
            if name in _FILLS and isinstance(filled, torch.Tensor) and filled.is_meta:
                return filled
            if name in _FACTORIES and kwargs.get("device") in (None, "meta") and kwargs.get("out") is None:
                size = _FACTORIES[name](*args) if args else ()
                if size and all(isinstance(n, int) for n in size):
                    return torch.empty(tuple(size), dtype=kwargs.get("dtype"), device="meta",
                                       requires_grad=bool(kwargs.get("requires_grad")))
            return func(*args, **kwargs)

    with torch.device("meta"), SkipFills():
        yield


def check_width(arch: ModelArgs) -> None:
    """The check the attention families share: the width a multiple of the heads."""
    if arch.n_embd % arch.n_head:
        from auralm.errors import UserError

        raise UserError(f"model.n_embd={arch.n_embd} is not a multiple of model.n_head={arch.n_head}")


def check_result(name: str, ok: bool, detail: str) -> dict:
    """One validate-model check, as its report shows it (a family's ``validate_checks`` returns these)."""
    return {"check": name, "ok": bool(ok), "detail": detail}


_FAMILIES: dict[str, ModelFamily] = {}
# every family's named sizes, in registration order (auralm.training.config.SIZES is this dict)
SIZES: dict[str, ModelArgs] = {}
_SIZE_TASKS: dict[str, set[str]] = {}
KEYS: dict[str, Any] = {}  # every family's keys with their types (one type a key, whichever family reads it)


def register(family: ModelFamily) -> ModelFamily:
    """Add ``family`` (its name and sizes must be new; a plain size may be shared by plain families; a key another
    family reads must have its type there)."""
    if family.name in _FAMILIES:
        raise ValueError(f"model family {family.name!r} is registered twice")
    for key, typ in family.keys.items():
        if KEYS.get(key, typ) != typ:
            raise ValueError(f"model family {family.name!r}: model.{key} is {typ} there and {KEYS[key]} in another "
                             f"family: one key, one type")
    for name, size in family.sizes.items():
        if name in SIZES and (SIZES[name] != size or not family.plain):
            raise ValueError(f"model family {family.name!r}: size {name!r} is another family's")
        if type(size) is not family.args:
            raise ValueError(f"model family {family.name!r}: size {name!r} must be a {family.args.__name__}")
    for name, size in family.sizes.items():  # all checked: now registered
        SIZES.setdefault(name, size)
        _SIZE_TASKS.setdefault(name, set()).update(family.tasks)
    KEYS.update(family.keys)
    _FAMILIES[family.name] = family
    return family


def names() -> list[str]:
    return list(_FAMILIES)


def families() -> list[ModelFamily]:
    return list(_FAMILIES.values())


def get(name: str) -> ModelFamily:
    try:
        return _FAMILIES[name]
    except KeyError:
        raise ValueError(f"no model family {name!r} (registered: {', '.join(_FAMILIES)}; a family of your own is "
                         f"registered by a module named in {PLUGINS_ENV})") from None


def of(task: str, arch: ModelArgs) -> ModelFamily:
    """The family that builds ``arch`` on ``task``: the one its class names, else the plain family of the task."""
    return get(arch.family) if arch.family else plain(task)


def plain(task: str) -> ModelFamily:
    """The plain family that builds the plain sizes on ``task``."""
    for fam in _FAMILIES.values():
        if fam.plain and task in fam.tasks:
            return fam
    from auralm.errors import UserError

    raise UserError(f"no model family builds model sizes on task={task}: register a family whose tasks include it "
                    f"(auralm/models/registry.py), or name a size of a family that trains it")


def size_family(size: ModelArgs) -> str:
    """The family a named size belongs to, as auralm.models.families groups the keys: a plain size is the first
    plain family's (GPT's, shared with the sudoku transformer)."""
    return size.family or next(f.name for f in _FAMILIES.values() if f.plain)


def args_from_saved(task: str, saved: dict) -> ModelArgs:
    """The args of a saved model section (a checkpoint's config: its fields, ``name`` the size it was and ``family``
    its family, absent for a plain size): the family's class, on top of the named size where it is one of that
    family's (so that a key added since the file was written gets the size's value)."""
    fam = get(saved["family"]) if saved.get("family") else plain(task)
    return fam.args.from_dict(saved, fam.sizes.get(saved.get("name")))


def size_tasks(name: str) -> set[str]:
    """The tasks a named size can train."""
    return set(_SIZE_TASKS.get(name, ()))


def size_task(name: str) -> str | None:
    """The task a named size trains when none is given: its family's only task, or the one its family names for
    it (``size_task``), else None (the config's default)."""
    tasks = size_tasks(name)
    if len(tasks) == 1:
        return next(iter(tasks))
    return next((f.size_task[name] for f in _FAMILIES.values() if name in f.size_task), None)


def _import(module: str, source: str) -> None:
    """Import a family's module; one that cannot be imported is one line on stderr and exit 2 (this happens while
    auralm.training.config is imported, before any command's own handling of bad input)."""
    try:
        importlib.import_module(module)
    except ImportError as e:
        print(f"error: {source}: cannot import the model family module {module!r} ({e}); it must be importable by "
              f"this Python (on PYTHONPATH, or installed)", file=sys.stderr)
        raise SystemExit(2) from None


def load() -> None:
    """Import the built-in families and the plugins named in AURALM_MODEL_PLUGINS (once)."""
    for module in BUILTIN:
        _import(module, "auralm")
    for module in filter(None, (m.strip() for m in os.environ.get(PLUGINS_ENV, "").split(","))):
        _import(module, PLUGINS_ENV)


load()
