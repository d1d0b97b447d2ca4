"""What a model family's model reads, typed: one frozen dataclass per family (``PlainArgs`` in ``gpt/spec.py``,
``HRMArgs`` in ``hrm/spec.py``, ...), subclassing :class:`ModelArgs`. Its fields are the keys the family's model
reads, each with its type and default; a named size (``model=hrm-tiny``) is an instance, and ``model.KEY=VALUE``
makes another with that field replaced (:meth:`ModelArgs.replace`). Every value is checked against its field's type
as an instance is made: ``int``, ``float`` (an integer is taken), ``bool``, ``str``, a ``Literal`` of the values a
choice takes, or one of them ``| None``. A family's name is the class's ``family`` (empty for the plain sizes, which
GPT on text and the sudoku transformer share), not a field.

What crosses a boundary as text (a checkpoint's config.yaml, the run's config.json) is :meth:`ModelArgs.to_dict`,
and comes back through :meth:`ModelArgs.from_dict`. Standard library only.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from auralm.errors import UserError

__all__ = ["ModelArgs", "Literal", "field_types", "type_name", "typed"]


def field_types(cls: type | ModelArgs) -> dict[str, Any]:
    """The fields of an args class (or instance) and their types, in declaration order."""
    return dict(_field_types(cls if isinstance(cls, type) else type(cls)))


@functools.cache
def _field_types(cls: type) -> tuple:
    """Once a class: its annotations are resolved (typing.get_type_hints) when the first instance is made, not at
    every instance and every ``replace``."""
    hints = typing.get_type_hints(cls)
    return tuple((f.name, hints[f.name]) for f in dataclasses.fields(cls))


def _options(typ) -> tuple[Any, bool]:
    """(the type without ``| None``, whether None is allowed)."""
    if typing.get_origin(typ) in (types.UnionType, typing.Union) and type(None) in typing.get_args(typ):
        return next(t for t in typing.get_args(typ) if t is not type(None)), True
    return typ, False


def type_name(typ) -> str:
    """A type as a message says what it expects."""
    base, _ = _options(typ)
    if typing.get_origin(base) is Literal:
        return "one of " + ", ".join(map(str, typing.get_args(base)))
    return {bool: "true or false", int: "an integer", float: "a number"}.get(base, "a string")


def typed(key: str, value: Any, typ) -> Any:
    """``value`` as a value of ``typ`` (an integer for a float field becomes a float), or a UserError naming
    ``model.<key>`` and what it expects."""
    base, nullable = _options(typ)
    if value is None and nullable:
        return None
    if typing.get_origin(base) is Literal:
        ok = value in typing.get_args(base)
    elif base is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        value = float(value) if ok else value
    elif base is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    else:
        ok = isinstance(value, base)
    if not ok:
        raise UserError(f"model.{key}={value!r}: expected {type_name(typ)}")
    return value


@dataclass(frozen=True, kw_only=True)
class ModelArgs:
    """The fields every family's model reads: its width, heads, context length and dropout."""

    family: ClassVar[str] = ""  # the family these args build (auralm.models.registry); "": a plain size
    n_embd: int
    n_head: int
    block_size: int  # the context length on text (a grid task sees its own number of cells)
    dropout: float = 0.0

    def __post_init__(self):
        for key, typ in field_types(self).items():
            object.__setattr__(self, key, typed(key, getattr(self, key), typ))

    def replace(self, **changes: Any) -> ModelArgs:
        """These args with ``changes`` (a key the family does not read is a UserError)."""
        unknown = sorted(set(changes) - set(field_types(self)))
        if unknown:
            raise UserError(f"model.{unknown[0]} is not a key of {type(self).__name__} (its keys: "
                            f"{', '.join(field_types(self))})")
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        """The fields, and ``family`` when these args are not a plain size: as a config file saves them."""
        return {**({"family": self.family} if self.family else {}), **dataclasses.asdict(self)}

    @classmethod
    def from_dict(cls, saved: dict, base: ModelArgs | None = None) -> ModelArgs:
        """Args of this class from a saved model section: its fields on top of ``base`` (the named size it was, so
        that a field added since the file was written gets the size's value). Keys that are not fields of this
        class (``name``, ``family``, or a key of another version) are left out."""
        values = {k: v for k, v in saved.items() if k in field_types(cls)}
        return base.replace(**values) if isinstance(base, cls) else cls(**values)
