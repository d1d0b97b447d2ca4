"""What HRM and TRM share in their declarations (``hrm/spec.py``, ``trm/spec.py``): the keys both their models read
beyond the shape's, with their types and defaults (:class:`RecurrentArgs`), and their checks. What a task's samples
are (their length, values, classes, whether a position sees those after it) the task says (auralm.tasks). No torch.

``model.pos_encodings=sudoku`` is a value of these families' own option, a kind of positions (a grid's rows,
columns and boxes, and a learned bias per relation between two cells: auralm/models/act.py), spelled like the task
it was made for; testing it is not a test of the task's name. It needs a task whose positions see each other
(``Task.causal`` False), as does TRM's ``mlp_t``."""

from __future__ import annotations

from dataclasses import dataclass

from auralm import tasks
from auralm.errors import UserError
from auralm.models import registry
from auralm.models.args import Literal, ModelArgs

Positions = Literal["auto", "rope", "learned", "sudoku", "none"]
POSITIVE = ("L_layers", "H_cycles", "L_cycles", "halt_max_steps")
TASKS = ("sudoku", "maze", "lm")  # the tasks HRM and TRM train on


@dataclass(frozen=True, kw_only=True)
class RecurrentArgs(ModelArgs):
    """What HRM's and TRM's models both read (each family adds its own: HRM's H level, TRM's MLP over positions)."""

    L_layers: int
    H_cycles: int  # TRM: T
    L_cycles: int  # TRM: n
    halt_max_steps: int  # segments at most (1: ACT off)
    expansion: float = 4.0  # SwiGLU width, as the parameters of an MLP this many times the hidden size
    halt_exploration_prob: float = 0.1
    puzzle_emb_ndim: int = 0  # 0: no puzzle embedding
    # positions in front of the grid (TRM's 16: the embedding, then zeros); 0: as many as the embedding fills
    puzzle_emb_len: int = 0
    pos_encodings: Positions = "rope"
    loss_type: Literal["softmax", "stablemax"] = "softmax"  # the cross-entropy
    norm: Literal["post", "pre"] = "post"  # the papers' norm after each residual add, or before each sublayer
    eval_segments: int = 0  # segments at evaluation and solving (0: halt_max_steps; more can solve more)
    # output classes no target has, besides the task's (the public HRM and TRM heads: PAD and blank beside sudoku's
    # 9 digits, PAD beside a maze's 5; the recipes)
    extra_classes: int = 0


def check(task: str, name: str, arch: RecurrentArgs) -> None:
    """The values HRM and TRM cannot work with."""
    registry.check_width(arch)
    check_values(task, name, arch)


def check_values(task: str, name: str, arch: RecurrentArgs, mlp_t: bool = False) -> None:
    """``mlp_t``: the model mixes the positions with an MLP (TRM's option), which needs them all at once."""
    if arch.expansion <= 0 or not 0 <= arch.halt_exploration_prob <= 1 or arch.puzzle_emb_ndim < 0 \
            or arch.eval_segments < 0 or arch.puzzle_emb_len < 0 or arch.extra_classes < 0:
        raise UserError("model.expansion must be > 0, model.halt_exploration_prob in [0, 1], "
                        "model.puzzle_emb_ndim, model.puzzle_emb_len, model.eval_segments and model.extra_classes "
                        ">= 0")
    filled = -(-arch.puzzle_emb_ndim // arch.n_embd)
    if arch.puzzle_emb_len and not 0 < filled <= arch.puzzle_emb_len:
        raise UserError(f"model.puzzle_emb_len={arch.puzzle_emb_len}: the puzzle embedding's positions need "
                        f"model.puzzle_emb_ndim > 0 and at least the {filled} position(s) its "
                        f"{arch.puzzle_emb_ndim} numbers fill")
    if tasks.get(task).causal and (arch.pos_encodings == "sudoku" or mlp_t):
        what = "pos_encodings=sudoku" if arch.pos_encodings == "sudoku" else "mlp_t=true"
        grids = " or ".join(f"task={n}" for n in tasks.names() if not tasks.get(n).causal)
        raise UserError(f"model={name} with {what} is for {grids}; on task={task} use "
                        f"model.pos_encodings=rope and model.mlp_t=false")
    if arch.pos_encodings == "sudoku" and tasks.get(task).length(arch) != 81:
        raise UserError(f"model={name} with pos_encodings=sudoku needs a sudoku grid's 81 cells; on task={task} use "
                        f"model.pos_encodings=rope (or auto)")
    if arch.pos_encodings == "rope" and (arch.n_embd // arch.n_head) % 2:
        raise UserError(f"rotary positions need an even head size, not {arch.n_embd // arch.n_head}")


def build(core_module: str, task: str, arch: RecurrentArgs, vocab: int | None):
    """The ACT model around the core that ``core_module``'s ``build`` makes, of the task's shape: its input values,
    classes and length, causal or not (9 digits out of 10 cell values over 81 cells on sudoku, the vocabulary over
    ``block_size`` tokens, causal, on text). ``model.extra_classes`` more outputs after the task's classes, which no
    target has: the public code's heads (PAD and blank besides the digits) normalise over them too."""
    import importlib

    t = tasks.get(task)
    return importlib.import_module(core_module).build(arch, vocab=t.values(vocab),
                                                      n_out=t.classes(vocab) + arch.extra_classes,
                                                      seq_len=t.length(arch), causal=t.causal)


def act_class(task: str, arch: RecurrentArgs) -> type:
    from auralm.models.act import ACT

    return ACT
