"""The tasks a run trains on, each declared once: ``task=NAME`` looks its class up here.

A task says what its samples are and how they are scored: the positions a sample holds, whether a position sees
only those before it (text) or all of them (a grid), the values an input position takes, the model's output
classes, whether a sample counts as solved only when every scored position is right (exact accuracy: sudoku's
grids), whether its data holds a tokenizer (the vocabulary is the tokenizer's: text), whether
``training.augment`` applies, its data's splits as datasets, a random batch of its shape (the planners' probes),
and the targets the recurrent models are trained on. The trainer, the planners and the tools ask the task; none
of them tests its name.

Adding a task is one folder under ``auralm/tasks/`` holding a ``Task`` subclass, and one ``register`` line below
(or ``register`` from outside, with the class itself). The classes import torch only inside their methods, so
that config.py, which checks ``task=`` against ``names()``, imports none.

Imports the standard library only.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from auralm.models.args import ModelArgs


class Task:
    """The interface, with the defaults of a task of token sequences."""

    name = ""
    unit = "tokens"  # what a sample of the throughput line counts: "tokens" (tok/s) or "puzzles"
    solved_whole = False  # a sample is right only when all its scored positions are: exact accuracy, the final
    #                       evaluation over the whole split and its line
    tokenized = False  # its data holds a tokenizer: the vocabulary is the tokenizer's (meta.json)
    augment = False  # training.augment applies (sudoku: digit, row and column permutations)
    causal = True  # a position is predicted from those before it (text); False: every position of a sample sees
    #                all of them (a grid: the recurrent models' grid options, model.pos_encodings=sudoku and mlp_t)
    source = ""  # prepare-data's SOURCE in the lines that name the command ("corpus.txt"); "": its data are made
    default_vocab: int | None = None  # the size estimate's vocabulary before any data exist
    accuracy = "token_acc"  # the evaluation's per-position accuracy key
    train_metric = ("lm_loss", "lm_loss", 4)  # the recurrent models' meter key on the log line, its label, places

    prepare_hint = ""  # what prepare_command's SOURCE may be, after it in the same line

    def prepare_command(self, out: str) -> str:
        """The `hrmctl prepare-data` line that makes the data directory ``out`` for this task."""
        import shlex

        source = f"{shlex.quote(self.source)} " if self.source else ""
        return f"hrmctl prepare-data {source}--task {self.name} --out {shlex.quote(out)}"

    def prepare(self, source: str | None, out: Path, options: dict) -> str:
        """`hrmctl prepare-data` for this task: the data directory ``out`` made from ``source`` with prepare-data's
        options (``options``, by name); the line that says what was written. Options that do not go together are one
        UserError."""
        from auralm.errors import UserError

        raise UserError(f"task={self.name} has no prepare-data: its data are made another way")

    def positions(self, arch: ModelArgs) -> int:
        """The positions of a sample the model is fed."""
        return arch.block_size

    def length(self, arch: ModelArgs) -> int:
        """The positions of a sample as its data hold them (``positions`` adds what a model puts before them)."""
        return arch.block_size

    def values(self, vocab: int | None) -> int | None:
        """The values an input position takes: the model's input vocabulary."""
        return vocab

    def classes(self, vocab: int | None) -> int | None:
        """The model's output classes."""
        return vocab

    def vocab(self, meta: dict) -> int | None:
        """The vocabulary a data directory's manifest gives the model (None: the task's own)."""
        return meta["tokenizer"]["vocab_size"] if self.tokenized else None

    def default_rows(self) -> tuple[int, int] | None:
        """(train, val) samples of the data a run makes itself when none is given (None: it makes none)."""
        return None

    def make_default(self, data_dir: Path) -> None:
        """Make the default data in ``data_dir`` (tasks with ``default_rows``)."""
        raise NotImplementedError

    def open_split(self, data_dir: Path, meta: dict, split: str, block_size: int):
        """A split of a data directory, as the trainer and the evaluation read it."""
        from auralm.data import datadir

        return datadir.TokenWindows(data_dir, meta, split, block_size)

    def open_file(self, path: str):
        """A file of samples in this task's text form (``hrmctl eval --puzzles``), read as a split."""
        from auralm.errors import UserError

        raise UserError(f"--puzzles FILE: task={self.name} has no file of samples to read: give --data DIR")

    def random_batch(self, arch: ModelArgs, vocab: int | None, batch: int, device):
        """Inputs and targets of the shape the trainer feeds, random (the planners' probes)."""
        import torch

        g = torch.Generator().manual_seed(0)
        x = torch.randint(0, vocab, (batch, arch.block_size), generator=g)
        y = torch.randint(0, vocab, (batch, arch.block_size), generator=g)
        return x.to(device), y.to(device)

    def targets(self, x, y):
        """The recurrent models' targets for every position."""
        return y


class Grid(Task):
    """A puzzle on a grid (sudoku, maze): every cell sees every other, a puzzle is solved when each scored cell is
    right, and the recurrent models put their puzzle embedding's positions before the cells."""

    unit = "puzzles"
    solved_whole = True
    causal = False
    accuracy = "cell_acc"
    train_metric = ("train_exact_accuracy", "exact", 3)

    def positions(self, arch: ModelArgs) -> int:
        return self.length(arch) + prefix_positions(arch)


class Entry:
    def __init__(self, target: Any):
        self.target, self.task = target, None

    def load(self) -> Task:
        if self.task is None:
            cls = self.target
            if isinstance(cls, str):
                module, _, attr = cls.partition(":")
                cls = getattr(importlib.import_module(module), attr)
            self.task = cls()
        return self.task


_REGISTRY: dict[str, Entry] = {}


def register(name: str, target: Any) -> None:
    """Make ``task=<name>`` train ``target`` (a Task class, or "module:Class")."""
    _REGISTRY[name] = Entry(target)


def unregister(name: str) -> None:
    _REGISTRY.pop(name, None)


def names() -> tuple[str, ...]:
    """The values ``task=`` takes."""
    return tuple(_REGISTRY)


def get(name: str) -> Task:
    """The task ``task=<name>`` names (a registered one: config.py checks the name first)."""
    return _REGISTRY[name].load()


def prefix_positions(arch: ModelArgs) -> int:
    """The positions a model with a puzzle embedding puts before a sample's own (HRM, TRM): as many as the embedding's
    ``puzzle_emb_ndim`` numbers fill, or ``puzzle_emb_len`` (TRM's 16: the embedding, then zeros)."""
    ndim = getattr(arch, "puzzle_emb_ndim", 0)
    return max(-(-ndim // arch.n_embd), arch.puzzle_emb_len) if ndim else 0


def open_split(data_dir: Path, meta: dict, split: str, block_size: int):
    """A split of a data directory (``meta``: its manifest), as the task it holds reads it."""
    return get(meta["task"]).open_split(data_dir, meta, split, block_size)


register("sudoku", "auralm.tasks.sudoku:Sudoku")
register("lm", "auralm.tasks.lm:Text")
register("maze", "auralm.tasks.maze:Maze")
