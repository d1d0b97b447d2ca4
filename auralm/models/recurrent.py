"""What HRM and TRM share in their declarations (``hrm/spec.py``, ``trm/spec.py``): the defaults of their sizes,
the keys their models read beyond the shape's, the values those keys take, and their checks. What a task's samples
are (their length, values, classes, whether a position sees those after it) the task says (auralm.tasks). No torch.

``model.pos_encodings=sudoku`` is a value of these families' own option, a kind of positions (a grid's rows,
columns and boxes, and a learned bias per relation between two cells: auralm/models/act.py), spelled like the task
it was made for; testing it is not a test of the task's name. It needs a task whose positions see each other
(``Task.causal`` False), as does TRM's ``mlp_t``."""

from __future__ import annotations

from auralm import tasks
from auralm.errors import UserError
from auralm.models import registry

DEFAULTS = dict(expansion=4.0, halt_exploration_prob=0.1, puzzle_emb_ndim=0, puzzle_emb_len=0, pos_encodings="rope",
                mlp_t=False, loss_type="softmax", norm="post", eval_segments=0, dropout=0.0,
                extra_classes=0)
KEYS = ("expansion", "H_layers", "L_layers", "H_cycles", "L_cycles", "halt_max_steps", "halt_exploration_prob",
        "puzzle_emb_ndim", "puzzle_emb_len", "pos_encodings", "mlp_t", "loss_type", "norm", "eval_segments",
        "extra_classes")
POSITIVE = ("L_layers", "H_cycles", "L_cycles", "halt_max_steps")
NORMS = ("post", "pre")
POSITIONS = ("auto", "rope", "learned", "sudoku", "none")
LOSS_TYPES = ("softmax", "stablemax")
TASKS = ("sudoku", "maze", "lm")  # the tasks HRM and TRM train on


def one_of(key: str, value: str, allowed) -> None:
    if value not in allowed:
        raise UserError(f"{key}={value!r}: expected one of {', '.join(allowed)}")


def check(task: str, name: str, arch: dict) -> None:
    """The values HRM and TRM cannot work with."""
    registry.check_width(arch)
    check_values(task, name, arch)


def check_values(task: str, name: str, arch: dict) -> None:
    if arch["expansion"] <= 0 or not 0 <= arch["halt_exploration_prob"] <= 1 or arch["puzzle_emb_ndim"] < 0 \
            or arch["eval_segments"] < 0 or arch["puzzle_emb_len"] < 0 or arch["extra_classes"] < 0:
        raise UserError("model.expansion must be > 0, model.halt_exploration_prob in [0, 1], "
                        "model.puzzle_emb_ndim, model.puzzle_emb_len, model.eval_segments and model.extra_classes "
                        ">= 0")
    filled = -(-arch["puzzle_emb_ndim"] // arch["n_embd"])
    if arch["puzzle_emb_len"] and not 0 < filled <= arch["puzzle_emb_len"]:
        raise UserError(f"model.puzzle_emb_len={arch['puzzle_emb_len']}: the puzzle embedding's positions need "
                        f"model.puzzle_emb_ndim > 0 and at least the {filled} position(s) its "
                        f"{arch['puzzle_emb_ndim']} numbers fill")
    one_of("model.pos_encodings", arch["pos_encodings"], POSITIONS)
    one_of("model.loss_type", arch["loss_type"], LOSS_TYPES)
    one_of("model.norm", arch["norm"], NORMS)
    if tasks.get(task).causal and (arch["pos_encodings"] == "sudoku" or arch["mlp_t"]):
        what = "pos_encodings=sudoku" if arch["pos_encodings"] == "sudoku" else "mlp_t=true"
        grids = " or ".join(f"task={n}" for n in tasks.names() if not tasks.get(n).causal)
        raise UserError(f"model={name} with {what} is for {grids}; on task={task} use "
                        f"model.pos_encodings=rope and model.mlp_t=false")
    if arch["pos_encodings"] == "sudoku" and tasks.get(task).length(arch) != 81:
        raise UserError(f"model={name} with pos_encodings=sudoku needs a sudoku grid's 81 cells; on task={task} use "
                        f"model.pos_encodings=rope (or auto)")
    if arch["pos_encodings"] == "rope" and (arch["n_embd"] // arch["n_head"]) % 2:
        raise UserError(f"rotary positions need an even head size, not {arch['n_embd'] // arch['n_head']}")


def build(core_module: str, family: str, task: str, arch: dict, vocab: int | None):
    """The ACT model around the core that ``core_module``'s ``build`` makes, of the task's shape: its input values,
    classes and length, causal or not (9 digits out of 10 cell values over 81 cells on sudoku, the vocabulary over
    ``block_size`` tokens, causal, on text). ``model.extra_classes`` more outputs after the task's classes, which no
    target has: the public code's heads (PAD and blank besides the digits) normalise over them too."""
    import importlib

    t = tasks.get(task)
    return importlib.import_module(core_module).build(dict(arch, family=family), vocab=t.values(vocab),
                                                      n_out=t.classes(vocab) + arch["extra_classes"],
                                                      seq_len=t.length(arch), causal=t.causal)


def act_class(task: str, arch: dict) -> type:
    from auralm.models.act import ACT

    return ACT
