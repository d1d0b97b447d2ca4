"""A command line read into the trainer's Config: the one way there. Other projects' spellings are translated first
(auralm.guides.translate: the guides' keys, Hydra's ``+key``, ``config=FILE.yaml`` with them), then our keys are
applied (auralm.training.config). The trainer (``python -m auralm.training.train``), the launcher's check, the planning
tools and validate-model all read their ``key=value`` items here.

``python -m auralm.training.command_line [--check] [--resume] key=value ...`` is the trainer's --check without
importing torch (a fraction of a second instead of seconds): what the launcher runs before anything starts on any
node; ``--expand`` prints the overrides with every ``config=FILE.yaml`` spelled out, as JSON (what hrmctl sends to the
nodes, so they need no copy of the file).
"""

from __future__ import annotations

from auralm.errors import UserError
from auralm.guides.translate import translate
from auralm.training import config
from auralm.training.config import Config, Setting


def parse(overrides: list[str]) -> Config:
    """``key=value`` items as typed (ours or a guide's) -> the checked Config."""
    t = translate(overrides)
    return config.apply(Config(), t.settings, model=t.model, recipe=t.recipe)


def parse_command_line(args: list[str]) -> tuple[Config, bool]:
    """The trainer's command line, `[--check] [--resume] key=value ...` -> (config, only check it)."""
    overrides, check = [], False
    for a in args:
        if a == "--check":
            check = True
        elif a == "--resume":
            overrides.append("resume=latest")
        elif a.startswith("-"):
            raise UserError(f"unknown option {a} (options: --check, --resume; everything else is key=value, "
                            f"a YAML file as config=FILE.yaml)")
        else:
            overrides.append(a)
    return parse(overrides), check


def expand(overrides: list[str]) -> list[str]:
    """The overrides with every ``config=FILE.yaml`` (``+config=`` too) replaced by its settings as the file spells
    them, put first (as the config applies them); the others as given."""
    plain = [(item, config.split_item(item)[0].lstrip("+") == "config") for item in overrides]
    files = config.with_files([Setting("config", config.split_item(item)[1]) for item, is_file in plain if is_file])
    return [f"{s.key}={s.text}" for s in files] + [item for item, is_file in plain if not is_file]


if __name__ == "__main__":
    import sys

    try:
        if sys.argv[1:2] == ["--expand"]:
            import json

            print(json.dumps(expand(sys.argv[2:])))
            parse(expand(sys.argv[2:]))
        else:
            parse_command_line(sys.argv[1:])
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
