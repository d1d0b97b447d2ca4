"""What HRM and TRM share in their declarations (``hrm/spec.py``, ``trm/spec.py``): the defaults of their sizes,
the keys the HRM guides spell ``arch.<key>``, the values those keys take, and their checks. No torch."""

from __future__ import annotations

from auralm.errors import UserError
from auralm.models import registry

DEFAULTS = dict(expansion=4.0, halt_exploration_prob=0.1, puzzle_emb_ndim=0, pos_encodings="rope", mlp_t=False,
                loss_type="softmax", norm="post", eval_segments=0, dropout=0.0)
KEYS = ("expansion", "H_layers", "L_layers", "H_cycles", "L_cycles", "halt_max_steps", "halt_exploration_prob",
        "puzzle_emb_ndim", "pos_encodings", "mlp_t", "loss_type", "norm", "eval_segments")
POSITIVE = ("L_layers", "H_cycles", "L_cycles", "halt_max_steps")
NORMS = ("post", "pre")
POSITIONS = ("auto", "rope", "learned", "sudoku", "none")
LOSS_TYPES = ("softmax", "stablemax")


def one_of(key: str, value: str, allowed) -> None:
    if value not in allowed:
        raise UserError(f"{key}={value!r}: expected one of {', '.join(allowed)}")


def check(task: str, name: str, arch: dict) -> None:
    """The values HRM and TRM cannot work with."""
    registry.check_width(arch)
    check_values(task, name, arch)


def check_values(task: str, name: str, arch: dict) -> None:
    if arch["expansion"] <= 0 or not 0 <= arch["halt_exploration_prob"] <= 1 or arch["puzzle_emb_ndim"] < 0 \
            or arch["eval_segments"] < 0:
        raise UserError("model.expansion must be > 0, model.halt_exploration_prob in [0, 1], "
                        "model.puzzle_emb_ndim and model.eval_segments >= 0")
    one_of("model.pos_encodings", arch["pos_encodings"], POSITIONS)
    one_of("model.loss_type", arch["loss_type"], LOSS_TYPES)
    one_of("model.norm", arch["norm"], NORMS)
    if task == "lm" and (arch["pos_encodings"] == "sudoku" or arch["mlp_t"]):
        what = "pos_encodings=sudoku" if arch["pos_encodings"] == "sudoku" else "mlp_t=true"
        raise UserError(f"model={name} with {what} is for task=sudoku; on text use "
                        f"model.pos_encodings=rope and model.mlp_t=false")
    if arch["pos_encodings"] == "rope" and (arch["n_embd"] // arch["n_head"]) % 2:
        raise UserError(f"rotary positions need an even head size, not {arch['n_embd'] // arch['n_head']}")


def build(core_module: str, family: str, task: str, arch: dict, vocab: int | None):
    """The ACT model around the core that ``core_module``'s ``build`` makes: 9 digits out of 10 cell values over
    81 cells on sudoku, the vocabulary over ``block_size`` tokens (causal) on text."""
    import importlib

    sudoku = task == "sudoku"
    return importlib.import_module(core_module).build(dict(arch, family=family), vocab=10 if sudoku else vocab,
                                                      n_out=9 if sudoku else vocab,
                                                      seq_len=81 if sudoku else arch["block_size"], causal=not sudoku)


def act_class(task: str, arch: dict) -> type:
    from auralm.models.act import ACT

    return ACT
