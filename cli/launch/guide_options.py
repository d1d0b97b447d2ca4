"""The options a guide types after its launcher (``--model 50m --batch_size 8 --learning_rate 3e-4 --dry_run``), read
by ``hrmctl train`` as what they are here: trainer overrides (``model=50m``, ``training.lr=3e-4``) or its own options
(``--dry-run``). Everything else that looks like an option is refused in one line, with the "did you mean" of the
guides' table (auralm/models/guide_spellings.py)."""

from __future__ import annotations

from dataclasses import dataclass, field

from auralm.models import guide_spellings
from auralm.training.config import key_names
from cli.errors import HrmctlError

# hrmctl train's options a guide's spelling can stand for, as LaunchOptions' fields and their types
FLAGS = {"--dry-run": ("dry_run", bool), "--nproc": ("nproc", int), "--master-port": ("master_port", int)}


@dataclass
class Read:
    args: list[str] = field(default_factory=list)  # the overrides, the guide's options now key=value among them
    options: dict[str, object] = field(default_factory=dict)  # LaunchOptions field -> value
    said: list[str] = field(default_factory=list)  # "--learning_rate 3e-4 is training.lr=3e-4", for the log


def read(args: list[str], what: str, own: list[str]) -> Read:
    """``args`` with the guides' options read as ours, in order; an unknown option is one HrmctlError: ``what``
    says what the arguments are, ``own`` lists the command's options for "did you mean"."""
    out, i = Read(), 0
    while i < len(args):
        a = args[i]
        i += 1
        if not a.startswith("-") or a == "-":
            out.args.append(a)
            continue
        name, eq, value = a.partition("=")
        row = guide_spellings.OPTIONS.get(name)
        if row is None or not row.ours:
            hint = guide_spellings.suggest(name, own + key_names(), option=True)
            raise HrmctlError(f"unknown option {name}{hint or f'; {what}, and hrmctl options are listed by --help'}")
        takes_value = not (row.ours in FLAGS and FLAGS[row.ours][1] is bool)
        if takes_value and not eq:
            if i >= len(args) or args[i].startswith("--"):
                raise HrmctlError(f"{name} needs a value ({row.guide}'s spelling of {row.ours})")
            value, i = args[i], i + 1
        elif not takes_value and eq:
            raise HrmctlError(f"{name} takes no value ({row.guide}'s spelling of {row.ours})")
        shown = f"{name} {value}".strip()
        if row.ours in FLAGS:
            attr, typ = FLAGS[row.ours]
            try:
                out.options[attr] = True if typ is bool else typ(value)
            except ValueError:
                raise HrmctlError(f"{name} {value}: expected an integer ({row.ours})") from None
            out.said.append(f"{shown} is {row.ours} {value}".rstrip())
        else:
            out.args.append(f"{row.ours}={value}")
            out.said.append(f"{shown} is {row.ours}={value}" + (f" ({row.note})" if row.note else ""))
    return out
