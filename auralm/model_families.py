"""Keys belong to families: a ``model.*`` key is read by some families' models only (``H_layers`` by HRM, ``ffn_dim``
by the RLM, ``n_layer`` by GPT and the RLM). auralm.config asks two things here:

- :func:`choose`: with no ``model=`` (nor ``arch=``), do the keys name a family? A guide's spelling does
  (``arch.*`` and ``puzzle_emb_lr`` are the HRM repository's ``pretrain.py``, whose model is HRM; ``model.hidden_dim``
  and the rest of the RLM-mHC guide's spellings are the RLM), and so do our own ``model.*`` keys when one family
  alone has them all; else the default model stays.
- :func:`check`: a ``model.*`` key the chosen model does not read is refused in one line naming the family it
  belongs to and the ``model=`` that selects it (it used to be stored and ignored: another model, silently).

A family's keys are those of its named sizes (auralm.config.SIZES), less the ones its model never reads; its
name, the model= that selects it, its smallest size and the keys it never reads are declared by the family itself
(auralm.models.registry).
"""

from __future__ import annotations

from auralm import guide_spellings
from auralm.errors import UserError
from auralm.models import registry

# What a guide's line trains when it names no model: its own default (pretrain.py's arch is hrm_v1, the paper's
# 27M model; the RLM guide's quick start is rlm-tiny's shape). Our own keys pick the family's smallest.
GUIDE_SIZE = {"hrm": guide_spellings.ARCH_NAMES["hrm_v1"], "trm": guide_spellings.ARCH_NAMES["trm"], "rlm": "rlm-tiny"}
# the RLM guide's spellings (W&B's keys aside: they say nothing of the model)
_RLM_GUIDE = {s.theirs for s in guide_spellings.TABLE if s.guide == guide_spellings.RLM
              and not s.theirs.startswith("training.wandb.")} | {"data.train_path"}


def family(size: dict) -> str:
    return registry.size_family(size)


def keys_of(sizes: dict) -> dict[str, set[str]]:
    """Every family's model keys (without the ``model.`` prefix)."""
    out: dict[str, set[str]] = {}
    for size in sizes.values():
        out.setdefault(family(size), {"dropout"}).update(k for k in size if k != "family")
    for fam in out:
        out[fam] -= registry.get(fam).unread
    return out


def guide_family(typed_key: str) -> str | None:
    """The family a guide's spelling of a key stands for, or None (ours, or any family's)."""
    key = typed_key.lstrip("+")
    if key == "arch.mlp_t":
        return "trm"
    if key.startswith("arch.") or key in ("puzzle_emb_lr", "puzzle_emb_weight_decay"):
        return "hrm"
    return "rlm" if key in _RLM_GUIDE else None


def choose(sizes: dict, default: str, typed: dict[str, str], task: str | None) -> tuple[str, str] | None:
    """With no model named: (the size the keys name, the ``key=value`` that named it), or None for the default.
    ``typed``: our key -> the ``key=value`` as given (last one wins); ``task``: as given, or None. The model's
    shape keys decide first; a guide's training keys (``training.optimizer.lr``) only when the task allows."""
    shape = [(k, item) for k, item in typed.items() if k.startswith("model.")]
    found = [(fam, item) for k, item in shape + [(k, item) for k, item in typed.items() if not k.startswith("model.")]
             for fam in [guide_family(item.partition("=")[0])]
             if fam and (k.startswith("model.") or fam != "rlm" or task in (None, "lm"))]
    if found:  # arch.* is HRM's unless a key only TRM reads (arch.mlp_t) says TRM
        fam, item = next((f for f in found if f[0] == "trm"), found[0])
        return GUIDE_SIZE[fam], item
    keys = keys_of(sizes)
    fields = {k[len("model."):] for k, _ in shape}
    foreign = sorted(f for f in fields if f not in keys[family(sizes[default])])
    owners = [fam for fam, ks in keys.items() if fields <= ks]
    if foreign and len(owners) == 1:
        return registry.get(owners[0]).smallest, typed["model." + foreign[0]]
    return None


def check(sizes: dict, name: str, typed: dict[str, str], how: str) -> None:
    """Refuse a ``model.*`` key the model ``name`` does not read; ``how`` says how it was chosen ("" when given)."""
    keys = keys_of(sizes)
    fam = family(sizes[name])
    for k, item in typed.items():
        field = k[len("model."):]
        if not k.startswith("model.") or field in keys[fam]:
            continue
        owners = [f for f in keys if field in keys[f]]
        given = item.partition("=")[0]
        shown = given if given.lstrip("+") == k else f"{given} ({k})"
        where = " and ".join(short_title(f) for f in owners)
        select = " or ".join(registry.get(f).select for f in owners)
        raise UserError(f"{shown} is not a key of model={name} ({short_title(fam)}{how}): it belongs to "
                        f"{where}; {select} selects {'it' if len(owners) == 1 else 'one'}")


def short_title(fam: str) -> str:
    """A family's title without its parenthesis: "GPT", "RLM"."""
    return registry.get(fam).title.split(" (")[0]
