"""Keys belong to families: a ``model.*`` key is read by some families' models only (``H_layers`` by HRM, ``ffn_dim``
by the RLM, ``n_layer`` by GPT and the RLM). auralm.training.config asks two things here:

- :func:`choose`: with no ``model=``, do the keys name a family? Our own ``model.*`` keys do when the default model
  does not read one of them and one family alone has them all; else the default model stays. (A line in another
  project's words may name a model too: auralm.guides reads that before the config, and hands it over.)
- :func:`check`: a ``model.*`` key the chosen model does not read is refused in one line naming the family it
  belongs to and the ``model=`` that selects it (it used to be stored and ignored: another model, silently).

A family's keys are the fields of its args (what its model reads: auralm.models.args); its name, the model= that selects
it and its smallest size are declared by the family itself (auralm.models.registry).
"""

from __future__ import annotations

from auralm.errors import UserError
from auralm.models import registry
from auralm.models.args import ModelArgs, field_types


def family(size: ModelArgs) -> str:
    return registry.size_family(size)


def keys_of(sizes: dict[str, ModelArgs]) -> dict[str, set[str]]:
    """The model keys (without the ``model.`` prefix) of every family with a size in ``sizes``."""
    return {family(size): set(field_types(size)) for size in sizes.values()}


def choose(sizes: dict, default: str, typed: dict[str, str]) -> tuple[str, str] | None:
    """With no model named: (the size the keys name, the ``key=value`` that named it), or None for the default.
    ``typed``: our key -> the ``key=value`` as given (last one wins)."""
    shape = [(k, item) for k, item in typed.items() if k.startswith("model.")]
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
        shown = given if given == k else f"{given} ({k})"
        where = " and ".join(short_title(f) for f in owners)
        select = " or ".join(registry.get(f).select for f in owners)
        raise UserError(f"{shown} is not a key of model={name} ({short_title(fam)}{how}): it belongs to "
                        f"{where}; {select} selects {'it' if len(owners) == 1 else 'one'}")


def short_title(fam: str) -> str:
    """A family's title without its parenthesis: "GPT", "RLM"."""
    return registry.get(fam).title.split(" (")[0]
