"""The papers' training recipes as presets: ``recipe=NAME`` sets every hyper-parameter of the public configs, under
the keys the command line gives (those win).

HRM's and TRM's ``pretrain.py`` (github.com/sapientinc/HRM, github.com/SamsungSAILMontreal/TinyRecursiveModels) train
with the defaults of their ``config/cfg_pretrain.yaml`` under the lines of their READMEs: AdamATan2 with betas 0.9 and
0.95 and weight decay on every parameter, 2000 warmup steps then a constant rate (``lr_min_ratio: 1.0``), no gradient
clipping, a global batch of 768, the puzzle embedding under its own sign-SGD (``CastedSparseEmbeddingSignSGD``,
``puzzle_emb_lr``, decoupled weight decay ``puzzle_emb_weight_decay``) and, for TRM, 16 puzzle-embedding positions in
front of the 81 cells (one holds the learned embedding, the rest start at zero: scratch space) and EMA 0.999 of the
weights. Their output head has a class for each value of their vocabulary, PAD and blank included, which no target has
(``model.extra_classes``). The data is augmented once, when made (``--preset sudoku-extreme-1k-aug-1000``), not again
on the fly.

A line may also imply a recipe without naming it (a pasted ``pretrain.py`` line: auralm.guides.implied chooses it,
and auralm.training.config hands it here as ``implied``); ``recipe=none`` keeps hrmctl's own defaults. The log says
which recipe a run follows and what it set. Our tuned CPU defaults (``model=trm-tiny`` and the rest) are what a run
without a recipe gets. Imports the standard library only.
"""

from __future__ import annotations

from auralm.errors import UserError

# cfg_pretrain.yaml's training, as both repositories have it
PRETRAIN = ("training.optimizer=adam_atan2_if_installed", "training.beta1=0.9", "training.beta2=0.95",
            "training.warmup_steps=2000", "training.min_lr_ratio=1.0", "training.grad_clip=0",
            "training.global_batch_size=768", "training.batch_size=auto", "training.puzzle_emb_optimizer=sign_sgd",
            "training.augment=false",
            "training.lr=1e-4", "training.weight_decay=0.1", "training.puzzle_emb_lr=1e-2",
            "training.puzzle_emb_weight_decay=0.1", "training.decay_vectors=true")
# the READMEs' Sudoku-Extreme lines (sudoku-extreme-1k-aug-1000); their head has 11 classes (PAD, blank, the digits)
SUDOKU = ("training.weight_decay=1.0", "training.puzzle_emb_weight_decay=1.0", "model.extra_classes=2")
TRM = ("model.puzzle_emb_len=16", "training.ema=true", "training.ema_decay=0.999", "model.H_cycles=3",
       "model.L_layers=2", "training.lr=1e-4", "training.puzzle_emb_lr=1e-4")
# the READMEs' Maze-Hard lines (maze-30x30-hard-1k): the task, and the eight symmetries of each maze (TRM's data is
# made with them, --aug 7 here; on the fly they are the same draws)
MAZE = ("task=maze", "training.weight_decay=1.0", "training.puzzle_emb_weight_decay=1.0", "training.augment=true",
        "model.extra_classes=1")  # their head: PAD besides the 5 characters
# the READMEs' lengths: set by recipe=NAME itself; a pasted line gives its own (or hrmctl's default length)
LENGTHS = {"hrm-sudoku": ("training.epochs=20000", "training.eval_every_epochs=2000"),
           "trm-sudoku-mlp": ("training.epochs=50000", "training.eval_every_epochs=5000"),
           "trm-sudoku-att": ("training.epochs=50000", "training.eval_every_epochs=5000"),
           "hrm-maze": ("training.epochs=20000", "training.eval_every_epochs=2000"),
           "trm-maze": ("training.epochs=50000", "training.eval_every_epochs=5000")}

RECIPES: dict[str, tuple[str, tuple[str, ...]]] = {
    "hrm-sudoku": ("HRM's pretrain.py on Sudoku-Extreme (the HRM README's line: lr 7e-5, global batch 384, "
                   "20000 epochs)",
                   (*PRETRAIN, *SUDOKU, "model=hrm-27m", "training.lr=7e-5", "training.puzzle_emb_lr=7e-5",
                    "training.global_batch_size=384")),
    "trm-sudoku-mlp": ("TRM's pretrain.py on Sudoku-Extreme, the MLP variant (the TRM README's "
                       "pretrain_mlp_t_sudoku: about 87% exact)",
                       (*PRETRAIN, *SUDOKU, "model=trm-5m-mlp", *TRM, "model.L_cycles=6", "model.mlp_t=true",
                        "model.pos_encodings=none")),
    "trm-sudoku-att": ("TRM's pretrain.py on Sudoku-Extreme, the attention variant (the TRM README's "
                       "pretrain_att_sudoku: about 75% exact)",
                       (*PRETRAIN, *SUDOKU, "model=trm-7m", *TRM, "model.L_cycles=6")),
    "hrm-maze": ("HRM's pretrain.py on Maze-Hard (the HRM README's line: lr 1e-4, global batch 768, 20000 epochs)",
                 (*PRETRAIN, *MAZE, "model=hrm-27m", "training.puzzle_emb_lr=1e-4")),
    "trm-maze": ("TRM's pretrain.py on Maze-Hard (the TRM README's pretrain_att_maze30x30: about 85% exact)",
                 (*PRETRAIN, *MAZE, "model=trm-7m", *TRM, "model.L_cycles=4")),
}
NONE = "none"


def names() -> tuple[str, ...]:
    return tuple(RECIPES)


def chosen(given: list[str], implied: tuple[str, str] = ("", "")) -> tuple[str, str]:
    """The recipe and how it was chosen: the last ``recipe=NAME`` given (``given``: their texts; none: no recipe),
    else ``implied`` (a recipe the line implies, and how), else ("", "")."""
    if not given:
        return implied
    name = given[-1].strip()
    if name in ("", NONE):
        return "", ""
    if name not in RECIPES:
        raise UserError(f"recipe={name}: expected one of {', '.join(RECIPES)} (or none: hrmctl's own defaults)")
    return name, "recipe=" + name


def overrides(name: str, how: str) -> tuple[str, ...]:
    """The keys the recipe sets (``how``: chosen's). By name: its model and its README's length too; implied by a
    line: the model is the one that line names (auralm.guides.implied chooses it, and the log says from which key)."""
    if how.startswith("recipe="):
        return RECIPES[name][1] + LENGTHS[name]
    return tuple(item for item in RECIPES[name][1] if not item.startswith("model="))


def describe(name: str, how: str) -> str:
    """The log's line: the recipe, what it follows, how it was chosen and the keys it set (the command line's win)."""
    title, keys = RECIPES[name][0], overrides(name, how)
    final: dict[str, str] = {}
    for item in keys:
        key, _, value = item.partition("=")
        final[key] = value
    return (f"recipe {name}: {title}, from {how}; it sets " +
            " ".join(f"{k}={v}" for k, v in final.items()) + " (the command line's keys win)")
