"""A command line's ``key=value`` items, in any guide's spelling, as ours: :func:`translate`.

Every way from a command line to a Config comes through here first (auralm.training.command_line): Hydra's ``+key``,
a guide's key (``lr``, ``arch.hidden_size``, ``model.hidden_dim``, any ``arch.X`` as ``model.X``), ``arch=trm``, the
HRM launcher's ``model=50m``, ``data_paths=[DIR]``, a guide's words for our values (``training.mixed_precision=no``),
``training.optimizer.betas=[b1,b2]`` (two keys of ours), ``resume_from_checkpoint=true``, ``evaluators=[]`` (their
tooling's: accepted), and the same inside ``config=FILE.yaml`` (its errors name the file). What comes out is our keys
only, each with how it was typed, and what the line implies beyond them (auralm.guides.implied): the config
(auralm.training.config) knows no other spelling. A key that is neither ours nor a guide's is refused here, with the
nearest of both (:func:`auralm.guides.spellings.suggest`).
"""

from __future__ import annotations

from dataclasses import dataclass

from auralm.errors import UserError
from auralm.guides import implied, spellings
from auralm.models.args import ModelArgs, field_types
from auralm.models.hrm.spec import HRMArgs
from auralm.models.trm.spec import TRMArgs
from auralm.training import config, recipes
from auralm.training.config import Setting

# the HRM and TRM pretrain.py's arch.<key>: our recurrent models' own keys (beyond the shape every family has)
ARCH_KEYS = tuple(dict.fromkeys(k for args in (HRMArgs, TRMArgs) for k in field_types(args)
                                if k not in field_types(ModelArgs)))


@dataclass
class Translation:
    settings: list[Setting]  # ours, in the order the config applies them (the config files' first)
    model: tuple[str, str] = ("", "")  # the size the guide's keys name and the key=value that names it, or ("", "")
    recipe: tuple[str, str] = ("", "")  # the recipe a pasted pretrain.py line follows and how it was chosen


def translate(overrides: list[str]) -> Translation:
    """``key=value`` items as typed -> ours (config files spelled out) and what the line implies beyond them."""
    given = config.with_files([_plain(item) for item in overrides])
    keys = config.key_names()
    settings = [ours for s in given for ours in _in_file(s, keys)]
    data = [s.text for s in settings if s.key == "data_dir"]
    recipe = implied.recipe([(s.key, s.text) for s in given], data[-1] if data else "")
    typed: dict[str, str] = {}  # our key -> the key=value that set it as typed (the last), as the config will have it
    tasks = []
    for item in recipes.overrides(*recipe) if recipe[0] else ():  # as the config applies them: first
        key, text = config.split_item(item)
        typed[key] = f"recipe={recipe[0]}"
        tasks += [text] if key == "task" else []
    for s in settings:
        typed[s.key] = s.given
        tasks += [s.text] if s.key == "task" else []
    return Translation(settings, implied.model(typed, tasks[-1] if tasks else None), recipe)


def _plain(item: str) -> Setting:
    """An item as typed, without Hydra's ``+`` (kept in ``typed``)."""
    key, text = config.split_item(item)
    if not key.lstrip("+"):
        raise UserError(f"expected key=value, got {item!r}")
    return Setting(key.lstrip("+"), text, typed=f"{key}={text}")


def _in_file(s: Setting, keys: list[str]) -> list[Setting]:
    """:func:`_ours`, its errors naming the config file the setting comes from."""
    try:
        return _ours(s, keys)
    except UserError as e:
        if s.file:
            raise UserError(f"config file {s.file}: {e}") from None
        raise


def _ours(s: Setting, keys: list[str]) -> list[Setting]:
    """One setting as typed -> ours (``keys``: every key of ours): none (a key only their tooling reads), one, or two
    (``betas``)."""
    given = s.given.partition("=")[0]  # as typed, + and all: what messages name
    if s.key in spellings.ACCEPTED:
        if s.text not in spellings.ACCEPTED[s.key]:
            raise UserError(f"{given}={s.text}: only {' or '.join(spellings.ACCEPTED[s.key])} is supported")
        return []
    key, text = _canonical(s.key, s.text)
    if key in spellings.COMPOUND:
        pairs = list(zip(spellings.COMPOUND[key], _pair(given, text)))
    else:
        if key not in keys:
            known = keys + list(spellings.COMPOUND) + list(spellings.ACCEPTED) + ["arch." + k for k in ARCH_KEYS]
            hint = spellings.suggest(given, known) or f" (known keys: {', '.join(sorted(keys))})"
            raise UserError(f"unknown key {given!r}{hint}")
        pairs = [(key, text)]
    same = pairs == [(s.key, s.text)]  # ours as it is (Hydra's + aside): nothing to say of how it was typed
    return [Setting(k, t, typed="" if same else s.given, file=s.file) for k, t in pairs]


def _canonical(key: str, text: str) -> tuple[str, str]:
    """A guide's spelling of one key and its value (``arch=trm``, ``model=50m``, ``data_paths=[d]``, an alias,
    ``arch.*``, ``training.mixed_precision=no``, ``resume_from_checkpoint=true``) as ours."""
    if key == "arch":
        return "model", spellings.ARCH_NAMES.get(text, text)
    if key in ("model", "model.name"):  # model.name: a config file's `model: {name: ...}`
        return key, spellings.MODEL_ALIASES.get(text, text)
    if key == "data_paths":
        items = [t.strip().strip("'\"") for t in text.strip().strip("[]").split(",") if t.strip()]
        if len(items) != 1:
            raise UserError(f"data_paths={text}: give exactly one data directory (data_paths=[DIR] or data_dir=DIR)")
        text = items[0]
    if key in spellings.VALUES:  # a guide's words for our values (training.mixed_precision=no is fp32)
        words = spellings.VALUES[key]
        if text.lower() not in words:
            expected = "bf16, fp16 or fp32 (or no)" if key == "training.mixed_precision" else \
                f"one of {', '.join(sorted(words))}"
            raise UserError(f"{key}={text!r}: expected {expected}")
        text = words[text.lower()]
    if key == "resume_from_checkpoint":  # the Hugging Face Trainer's true: the newest checkpoint
        text = {"true": "latest", "false": "", "none": "", "null": ""}.get(text.lower(), text)
    key = spellings.ALIASES.get(key, key)
    if key.startswith("arch."):
        key = "model." + key[len("arch."):]
    return key, text


def _pair(given: str, text: str) -> tuple[str, str]:
    """``[0.9,0.95]``, ``(0.9, 0.95)`` or ``0.9,0.95`` as its two numbers' texts."""
    inner = text.strip()
    if len(inner) >= 2 and (inner[0], inner[-1]) in (("[", "]"), ("(", ")")):
        inner = inner[1:-1]
    parts = [p.strip() for p in inner.split(",")]
    if len(parts) == 2:
        try:
            [float(p) for p in parts]
            return parts[0], parts[1]
        except ValueError:
            pass
    raise UserError(f"{given}={text!r}: expected two numbers like [0.9,0.95]")
