"""What a guide's line implies beyond its keys: the model it trains where it names none (:data:`MODEL_KEYS`,
:data:`MODEL_PREFIXES`) and, for a pasted ``pretrain.py`` line, the paper's recipe it follows (:data:`PASTED`).

- The HRM repository's ``pretrain.py`` trains ``hrm_v1`` unless told otherwise, the paper's 27M model: its ``arch.*``
  keys and its puzzle embedding's optimizer (``puzzle_emb_lr``, ``puzzle_emb_weight_decay``) name ``hrm-27m``;
  ``arch.mlp_t``, a key only TRM reads, names TRM's ``trm-7m`` (a key named exactly wins over a prefix).
- The RLM-mHC guide's spellings (its W&B keys aside: they say nothing of the model) name ``rlm-tiny``, its quick
  start's shape; its training keys alone only where the task allows (not with ``task=sudoku``).
- A line with one of ``pretrain.py``'s own keys (``arch=``, ``arch.*``, ``data_path``, ``data_paths``,
  ``puzzle_emb_lr``, ``puzzle_emb_weight_decay``) and no ``model=`` follows TRM's recipe when it says ``arch=trm``
  (``arch.mlp_t=True``: the MLP variant), else HRM's, on Maze-Hard when its data names a maze set (``hrm-maze``,
  ``trm-maze``); ``recipe=NAME`` or ``recipe=none`` on the line wins (auralm/training/recipes.py).

auralm.guides.translate asks both; the config takes them where the line gives no ``model=`` / ``recipe=``.
"""

from __future__ import annotations

import json
import os

from auralm.guides import spellings
from auralm.models import registry

HRM_SIZE = spellings.ARCH_NAMES["hrm_v1"]  # pretrain.py's default arch
RLM_SIZE = "rlm-tiny"
# a guide's key (as typed, without Hydra's +) -> the size a line with it trains where it names no model
MODEL_KEYS: dict[str, str] = {
    "puzzle_emb_lr": HRM_SIZE, "puzzle_emb_weight_decay": HRM_SIZE,
    "arch.mlp_t": spellings.ARCH_NAMES["trm"],
    **dict.fromkeys((s.theirs for s in spellings.TABLE if s.guide == spellings.RLM and not s.is_option
                     and not s.theirs.startswith("training.wandb.")), RLM_SIZE),
    "data.train_path": RLM_SIZE,  # ours too, and the RLM guide's: text to train on
}
MODEL_PREFIXES: dict[str, str] = {"arch.": HRM_SIZE}  # where no key of MODEL_KEYS is on the line

# what a pasted pretrain.py line trains: (its arch=, the task its data holds) -> the recipe; with arch.mlp_t=True, MLP's
PASTED = {("hrm_v1", "sudoku"): "hrm-sudoku", ("hrm", "sudoku"): "hrm-sudoku", ("trm", "sudoku"): "trm-sudoku-att",
          ("hrm_v1", "maze"): "hrm-maze", ("hrm", "maze"): "hrm-maze", ("trm", "maze"): "trm-maze"}
MLP = {"trm-sudoku-att": "trm-sudoku-mlp"}
PRETRAIN_KEYS = ("arch", "data_path", "data_paths", "puzzle_emb_lr", "puzzle_emb_weight_decay")  # pretrain.py's own
PRETRAIN_TASK = "sudoku"  # pretrain.py's data, unless its directory says otherwise


def model(typed: dict[str, str], task: str | None) -> tuple[str, str]:
    """(the size a guide's keys name, the ``key=value`` that names it), or ("", ""). ``typed``: our key -> the
    ``key=value`` that set it as typed (the last one), in the order the keys were first set; ``task``: as given, or
    None. The model's shape keys (``model.*``) first; a key named exactly wins over a prefix."""
    ordered = sorted(typed.items(), key=lambda kv: not kv[0].startswith("model."))  # stable: shape keys first
    found = []
    for key, item in ordered:
        spelled = item.partition("=")[0].lstrip("+")
        exact = spelled in MODEL_KEYS
        size = MODEL_KEYS[spelled] if exact else \
            next((s for prefix, s in MODEL_PREFIXES.items() if spelled.startswith(prefix)), "")
        if size and (key.startswith("model.") or task is None or task in registry.size_tasks(size)):
            found.append((size, exact, item))
    if not found:
        return "", ""
    size, _, item = next((f for f in found if f[1]), found[0])
    return size, item


def recipe(given: list[tuple[str, str]], data_dir: str) -> tuple[str, str]:
    """The recipe a pasted ``pretrain.py`` line follows, and how it was chosen, or ("", ""). ``given``: the line's
    ``(key, text)`` as typed (Hydra's + dropped, config files' first); ``data_dir``: the data directory it names."""
    keys = [key for key, _ in given]
    signs = [k for k in keys if k in PRETRAIN_KEYS or k.startswith("arch.")]
    if not signs or any(k in ("model", "model.name", "recipe") for k in keys):
        return "", ""
    arch = [text.strip().lower() for key, text in given if key == "arch"]
    mlp = any(key in ("arch.mlp_t", "model.mlp_t") and text.strip().lower() in ("true", "1", "yes")
              for key, text in given)
    family = arch[-1] if arch else "trm" if mlp else "hrm_v1"  # HRM's pretrain.py: hrm_v1 unless the line says
    name = PASTED.get((family, data_task(data_dir) if data_dir else PRETRAIN_TASK), "")
    name = MLP.get(name, name) if mlp else name
    sign = f"arch={arch[-1]}" if arch else next(f"{k}=" for k in keys if k in signs)
    return (name, f"{sign} (a pretrain.py line; recipe=none keeps hrmctl's defaults)") if name else ("", "")


def data_task(path: str) -> str:
    """The task of the data in the directory ``path``: its manifest's when it is here, else the task of the preset
    it is named after (data/maze-30x30-hard-1k), else sudoku (pretrain.py's)."""
    from auralm.data.prepare_choices import PRESET_TASKS

    try:
        with open(os.path.join(os.path.expanduser(path), "meta.json")) as f:
            task = json.load(f).get("task")
            if isinstance(task, str):
                return task
    except (OSError, ValueError, AttributeError):
        pass
    return PRESET_TASKS.get(os.path.basename(path.rstrip("/")), PRETRAIN_TASK)
