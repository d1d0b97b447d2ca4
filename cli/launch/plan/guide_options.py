"""The options a guide types after its launcher (``--model 50m --batch_size 8 --learning_rate 3e-4 --dry_run``), read
by ``hrmctl train`` as what they are here: trainer overrides (``model=50m``, ``training.lr=3e-4``) or its own options
(``--dry-run``, ``--nproc``; ``--gpus N`` is ``--nproc N`` on nodes with N GPUs, ``--distributed`` the inventory's
nodes), or accepted as they are (``--verbose``). A guide's options that prepare data (AuraLM's ``--prepare
--dataset-name X --dataset-max-tokens N``) are refused together in one line with the ``hrmctl prepare-data`` line to
run first. Everything else that looks like an option is refused in one line, with the "did you mean" of the guides'
table (auralm/guides/spellings.py)."""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass, field

from auralm import tasks
from auralm.guides import spellings
from auralm.guides.spellings import Spelling
from auralm.errors import UserError
from auralm.training import command_line, config
from cli.errors import HrmctlError

# hrmctl train's options a guide's spelling can stand for, as LaunchOptions' fields and their types (--nodes:
# --distributed, a flag the command reads with the inventory)
FLAGS = {"--dry-run": ("dry_run", bool), "--nproc": ("nproc", int), "--master-port": ("master_port", int),
         "--nodes": ("distributed", bool)}
PREPARED_TASK = "lm"  # the task `hrmctl prepare-data` prepares when its line gives no --task (its parser's default)


@dataclass
class Read:
    args: list[str] = field(default_factory=list)  # the overrides, the guide's options now key=value among them
    options: dict[str, object] = field(default_factory=dict)  # LaunchOptions field -> value
    said: list[str] = field(default_factory=list)  # "--learning_rate 3e-4 is training.lr=3e-4", for the log
    prepare: list[tuple[Spelling, str]] = field(default_factory=list)  # the options that prepare data, as typed
    rows: list[Spelling] = field(default_factory=list)  # the rows read, in order


def read(args: list[str], what: str, own: list[str]) -> Read:
    """``args`` with the guides' options read as ours, in order; an unknown option is one HrmctlError: ``what``
    says what the arguments are, ``own`` lists the command's options for "did you mean"."""
    out, i = Read(), 0
    while i < len(args):
        a = args[i]
        i += 1
        if not a.startswith("-") or a == "-":
            if a.endswith(".py") and "=" not in a:  # the guide's own script, pasted with its options
                raise HrmctlError(f"{a} is a guide's script: hrmctl train runs its own trainer (auralm.training.train) "
                                  f"and reads the guide's options after it as ours; drop {a} from the line (or give "
                                  f"--module MODULE to start a module of yours instead)")
            out.args.append(a)
            continue
        name, eq, value = a.partition("=")
        row = spellings.option_row(name) or spellings.option_row(name, spellings.PREPARE)
        if row is None or not (row.ours or row.accepted):
            hint = spellings.suggest(name, own + config.key_names(), option=True)
            raise HrmctlError(f"unknown option {name}{hint or f'; {what}, and hrmctl options are listed by --help'}")
        if not row.flag and not eq:
            if i >= len(args) or args[i].startswith("--"):
                raise HrmctlError(f"{name} needs a value ({row.guide}'s spelling of {row.ours})")
            value, i = args[i], i + 1
        elif row.flag and eq:
            raise HrmctlError(f"{name} takes no value ({row.guide}'s {row.theirs}: {row.note or row.ours})")
        _take(out, row, name, value)
        out.rows.append(row)
    if out.prepare:
        raise HrmctlError(prepare_first(out.prepare, out.args))
    _implied(out)
    return out


def _implied(out: Read) -> None:
    """What the guide's options mean besides their own keys (AuraLM's: its GPT on text), added unless the line sets
    those keys itself (model= or arch=, task=), and said once."""
    given = {spellings.ALIASES.get(k, k) for k in (a.partition("=")[0].lstrip("+") for a in out.args)}
    given |= {"model"} if given & {"arch"} or any(k.startswith("model.") and k != "model.block_size" for k in given) \
        else set()
    rows = [r for r in out.rows if r.implies]
    added = [item for item in dict.fromkeys(w for r in rows for w in r.implies.split())
             if item.partition("=")[0] not in given]
    if added:
        out.args += added
        out.said.append(f"{' '.join(added)} ({rows[0].guide}'s model on text, where the line does not say)")


def _take(out: Read, row: Spelling, name: str, value: str) -> None:
    """One of the guide's options, read: into ``out``'s overrides, options or data options, and what it was said."""
    shown = f"{name} {value}".strip()
    if row.command == spellings.PREPARE:
        out.prepare.append((row, value))
    elif row.accepted:
        out.said.append(f"{shown} is accepted ({row.note})")
    elif row.ours in FLAGS:
        attr, typ = FLAGS[row.ours]
        try:
            out.options[attr] = True if typ is bool else typ(value)
        except ValueError:
            raise HrmctlError(f"{name} {value}: expected an integer ({row.ours})") from None
        if row.per_gpu:
            out.options["gpus"] = out.options[attr]
        if attr != "distributed":  # said by the command once the inventory has named the nodes
            out.said.append(f"{shown} is {row.ours} {value}".rstrip() + (f" ({row.note})" if row.note else ""))
    else:
        out.args.append(f"{row.ours}={value}")
        out.said.append(f"{shown} is {row.ours}={value}" + (f" ({row.note})" if row.note else ""))


def prepare_first(typed: list[tuple[Spelling, str]], args: list[str]) -> str:
    """The refusal of a guide's data options on hrmctl train: the ``hrmctl prepare-data`` line that does what they
    ask (into the line's data_dir, else data/<task> as the trainer reads it), to run first; or, when that
    directory is prepared already here, that they can go."""
    ours = [a for row, value in typed for a in spellings.prepare_args(row, value)]
    implied = {row.implies for row, _ in typed if row.implies}
    for extra in sorted(implied):
        if extra.split()[0] not in ours:
            ours += extra.split()
    try:  # where the line says its data is, as the trainer reads it (a guide's data_path, data_paths=[DIR] too)
        cfg = command_line.parse(args)
        given = cfg.data_dir if "data_dir" in cfg.given_keys else ""
    except (UserError, ValueError):  # refused: the trainer's check says why, after this
        given = ""
    task = ours[ours.index("--task") + 1] if "--task" in ours else PREPARED_TASK
    source = tasks.get(task).source if task in tasks.names() else ""  # what the task's data are made from
    out = given or f"data/{task}"
    if "--out" not in ours:
        ours += ["--out", out]
    else:
        out = ours[ours.index("--out") + 1]
    if source and not any(row.ours == spellings.SOURCE for row, _ in typed):
        ours.insert(0, source)  # --prepare alone: the text is the user's to name
    guide = typed[0][0].guide
    them = " ".join(shlex.join([row.theirs] + ([] if row.flag else [value])) for row, value in typed)
    line = f"hrmctl prepare-data {shlex.join(ours)}"
    what = f"{them} ({guide}) prepare{'s' if len(typed) == 1 else ''} data, which hrmctl does in a step of its own"
    them = "it" if len(typed) == 1 else "them"
    if os.path.isfile(os.path.join(out, "meta.json")):
        return f"{what}, and {out} is prepared already: drop {them} from this line (`{line}` prepares it again)"
    return f"{what}: run `{line}` first, then this line without {them}"


def across_machines(opts) -> str:
    """A guide's --distributed (AuraLM's: a run across machines) as hrmctl's nodes, said: the nodes --nodes names,
    else every node of the inventory (``opts.nodes`` set to them); one line naming the fix when there is none."""
    from cli.nodes.inventory import load_inventory

    row = next(s for s in spellings.OPTIONS.values() if s.ours == "--nodes")
    if opts.nodes_given or opts.nodes[0].slurm_job:
        return f"{row.theirs} is the run across --nodes {','.join(n.name for n in opts.nodes)}"
    inventory = load_inventory(opts.inventory)
    nodes = inventory.select(None) if inventory.nodes else []
    if len(nodes) < 2:
        where = (f"{inventory.path} names {len(inventory.nodes)} node" if inventory.path else
                 "there is no inventory (hrmctl.toml)")
        raise HrmctlError(f"{row.theirs} ({row.guide}'s run across machines): {where}; name the machines with "
                          f"--nodes node0,node1 (`hrmctl init --hosts HOST0,HOST1` writes hrmctl.toml with them), "
                          f"or drop {row.theirs} to train on this machine alone")
    opts.nodes = nodes
    return f"{row.theirs} is --nodes {','.join(n.name for n in nodes)} (every node of {inventory.path})"
