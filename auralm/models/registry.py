"""The model families by name: each declares itself once, as a :class:`ModelFamily` in its folder's ``spec.py``
(``auralm/models/hrm/spec.py``), and is registered here; nothing else in auralm tests a family's name.

A family says: its named sizes (``model=NAME``: the keys it reads and their defaults), the tasks it trains, how
to build its model, the class that build makes (what ``from_pretrained`` checks a checkpoint against), what its
values must satisfy (``config.check``), how many blocks autograd keeps per step (``auralm.planning.sizing``'s memory
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
:func:`register`. The variable is read in every process that reads a config: hrmctl's preflight and the trainer
under torchrun inherit it from ``hrmctl train``'s environment on this machine (a remote node needs the module
installed and the variable in its own environment). No torch here: ``auralm.training.config`` reads the sizes without
it;
a family's ``build`` imports its model when called.
"""

from __future__ import annotations

import importlib
import os
import sys
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable

PLUGINS_ENV = "AURALM_MODEL_PLUGINS"
BUILTIN = ("auralm.models.gpt.spec", "auralm.models.transformer.spec", "auralm.models.hrm.spec",
           "auralm.models.trm.spec", "auralm.models.rlm.spec")
SHAPE_KEYS = ("n_layer", "n_head", "n_embd", "block_size")  # greater than 0 wherever a size has them


def _n_layer(arch: dict) -> int:
    return arch["n_layer"]


def _one_pass(arch: dict) -> float:
    return 1.0


@dataclass(frozen=True)
class ModelFamily:
    name: str  # as checkpoints (config.yaml's "family"), logs and sizes (their "family" key) name it
    title: str  # in messages: "HRM"
    sizes: dict[str, dict]  # model=NAME -> the keys its model reads, with their defaults
    build: Callable[[str, dict, int | None], Any]  # (task, arch, vocab) -> the model (imports torch when called)
    model_class: Callable[[str, dict], type]  # the class build makes: from_pretrained's check of a checkpoint
    tasks: tuple[str, ...] = ("sudoku", "lm")
    # builds the sizes that have no "family" key on its tasks (GPT on lm and the sudoku transformer share them)
    plain: bool = False
    select: str = ""  # the model= that selects it, in messages ("model=hrm-tiny (or arch=hrm_v1)")
    smallest: str = ""  # the size its own model.* keys pick when no model= is given (""): its first size
    unread: frozenset = frozenset()  # keys in its sizes' dicts that its model never reads
    positive: tuple[str, ...] = ()  # keys beyond SHAPE_KEYS that must be greater than 0
    check: Callable[[str, str, dict], None] | None = None  # (task, size name, arch): UserError for what cannot work
    blocks_in_graph: Callable[[dict], int] = _n_layer  # blocks whose activations autograd keeps for one step
    passes: Callable[[dict], float] = _one_pass  # forward-pass equivalents of one step, a backward counting two
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

    def sent_shapes(self, task: str, arch: dict, vocab: int | None) -> list[tuple[int, ...]]:
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


def check_width(arch: dict) -> None:
    """The check the attention families share: the width a multiple of the heads."""
    if arch["n_embd"] % arch["n_head"]:
        from auralm.errors import UserError

        raise UserError(f"model.n_embd={arch['n_embd']} is not a multiple of model.n_head={arch['n_head']}")


def check_result(name: str, ok: bool, detail: str) -> dict:
    """One validate-model check, as its report shows it (a family's ``validate_checks`` returns these)."""
    return {"check": name, "ok": bool(ok), "detail": detail}


_FAMILIES: dict[str, ModelFamily] = {}
# every family's named sizes, in registration order (auralm.training.config.SIZES is this dict)
SIZES: dict[str, dict] = {}
_SIZE_TASKS: dict[str, set[str]] = {}


def register(family: ModelFamily) -> ModelFamily:
    """Add ``family`` (its name and sizes must be new; a plain size may be shared by plain families)."""
    if family.name in _FAMILIES:
        raise ValueError(f"model family {family.name!r} is registered twice")
    for name, size in family.sizes.items():
        if name in SIZES and (SIZES[name] != size or not family.plain):
            raise ValueError(f"model family {family.name!r}: size {name!r} is another family's")
        if not family.plain and size.get("family") != family.name:
            raise ValueError(f"model family {family.name!r}: size {name!r} must say family={family.name!r}")
        SIZES.setdefault(name, size)
        _SIZE_TASKS.setdefault(name, set()).update(family.tasks)
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


def of(task: str, arch: dict) -> ModelFamily:
    """The family that builds ``arch`` on ``task``: the one its size names, else the plain family of the task."""
    if arch.get("family"):
        return get(arch["family"])
    for fam in _FAMILIES.values():
        if fam.plain and task in fam.tasks:
            return fam
    from auralm.errors import UserError

    raise UserError(f"no model family builds model sizes on task={task}: register a family whose tasks include it "
                    f"(auralm/models/registry.py), or name a size of a family that trains it")


def size_family(size: dict) -> str:
    """The family a named size belongs to, as auralm.models.families groups the keys: a size without a "family"
    key is the first plain family's (GPT's, shared with the sudoku transformer)."""
    return size.get("family") or next(f.name for f in _FAMILIES.values() if f.plain)


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
