"""`hrmctl prepare-data`: its options, declared once, and the guides' spellings of them read as ours before they are
parsed (``ReadGuides``): AuraLM's ``--dataset-name X --dataset-max-tokens N`` are ``X --max-tokens N``, the HRM
guide's build_sudoku_dataset.py options imply ``--task sudoku`` (auralm/guides/spellings.py, its PREPARE rows).
What each was read as is said on stderr once the data is written; an unknown option is one line naming the nearest
of ours or of the guides'. The work is the task's own ``prepare`` (auralm.tasks; it imports torch: only when the
command runs).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Literal, Optional

import typer
from typer._click.exceptions import NoSuchOption  # typer's own copy of click
from typer.core import TyperCommand

from auralm import tasks
from auralm.data.prepare_choices import DIFFICULTIES, DTYPES, MAZE_DEFAULTS, PRESET_TASKS, SUDOKU_DEFAULTS
from cli.errors import HrmctlError
from cli.tools.common import user_errors

SAID = "hrmctl.read_as_ours"  # the context's meta: what the guides' spellings were read as
TEXT, SUDOKU = "Text (--task lm)", "Sudoku and mazes (--task sudoku, --task maze)"


def read_guides(argv: list[str]) -> tuple[list[str], list[str]]:
    """``argv`` with the guides' spellings of prepare-data's options read as ours, and what each was read as."""
    import shlex

    from auralm.guides import spellings

    out, said, implied, i = [], [], [], 0
    while i < len(argv):
        a = argv[i]
        i += 1
        name, eq, value = a.partition("=")
        row = spellings.option_row(name, spellings.PREPARE)
        if row is None:
            out.append(a)
            continue
        if not row.flag and not eq:
            if i >= len(argv) or argv[i].startswith("--"):
                raise HrmctlError(f"{name} needs a value ({row.guide}'s spelling of {row.ours})")
            value, i = argv[i], i + 1
        ours = spellings.prepare_args(row, value)
        said.append(f"{name} {value}".strip() + (f" is {shlex.join(ours)}" if ours else f" is accepted ({row.note})"))
        out += ours
        if row.implies and row.implies.split()[0] not in argv and row.implies not in implied:
            implied.append(row.implies)
    return out + [w for text in implied for w in text.split()], said


def own_options(command) -> list[str]:
    """The command's option names (``--out``, ``-h`` ...)."""
    return [o for p in command.params for o in (*getattr(p, "opts", ()), *getattr(p, "secondary_opts", ()))
            if o.startswith("-")]


class ReadGuides(TyperCommand):
    """prepare-data's parsing: the guides' spellings first (``read_guides``), then Typer's; an unknown option and a
    second SOURCE are one line in hrmctl's words."""

    def parse_args(self, ctx, args: list[str]) -> list[str]:
        try:
            args, ctx.meta[SAID] = read_guides(args)
        except HrmctlError:
            if not ctx.resilient_parsing:  # completion reads the line as it is being typed
                raise
        try:
            rest = super().parse_args(ctx, args)
        except NoSuchOption as e:
            from auralm.guides import spellings

            hint = spellings.suggest(e.option_name, own_options(self), option=True,
                                           command=spellings.PREPARE)
            raise HrmctlError(f"unknown option {e.option_name}"
                              f"{hint or f'; `{ctx.command_path} --help` lists the options'}") from None
        if rest and not ctx.resilient_parsing:
            source = ctx.params.get("source")
            raise HrmctlError(f"unexpected argument {rest[0]!r}: prepare-data takes one SOURCE (a file, a directory of "
                              f"them, or a dataset name{f', here {source!r}' if source else ''}); quote a path with "
                              f"spaces")
        return rest


def _difficulties() -> str:
    return ", ".join(f"{k} ({lo}-{hi} givens{', needs search' if k == 'extreme' else ''})"
                     for k, (lo, hi) in DIFFICULTIES.items())


def Count(text: str, panel: str = TEXT, least: int | None = 1):
    return Annotated[Optional[int], typer.Option(min=least, rich_help_panel=panel, show_default=False, help=text)]


def Text(text: str, panel: str = TEXT, metavar: str | None = None):
    return Annotated[Optional[str], typer.Option(rich_help_panel=panel, metavar=metavar, show_default=False, help=text)]


Source = Annotated[Optional[str], typer.Argument(
    metavar="SOURCE", show_default=False,
    help="lm: a .txt/.jsonl/.parquet file, a directory of them, or a dataset name (local, or in the Hugging Face "
         "cache).")]
Task = Annotated[Optional[Literal[tuple(sorted(tasks.names()))]], typer.Option(  # the registered tasks: each prepares
    show_default=False,  # its own
    help="The task whose data to prepare (hrmctl train's task=): lm, a text's tokens (the default); sudoku, puzzles; "
         "maze, 30x30 mazes. A --preset implies its task.")]
Out = Annotated[Optional[Path], typer.Option(
    metavar="DIR", show_default=False,
    help="The data directory to write (default: data/<task>, where hrmctl train looks for it).")]
VocabSize = Annotated[int, typer.Option(rich_help_panel=TEXT, help="The vocabulary of the tokenizer trained here.")]
Dtype = Annotated[Literal[DTYPES], typer.Option(rich_help_panel=TEXT, help="The token shards' width.")]
ShardTokens = Annotated[int, typer.Option(min=1, rich_help_panel=TEXT, help="Tokens per shard file.")]
MinLength = Annotated[int, typer.Option(min=0, rich_help_panel=TEXT, help="Drop texts shorter than this (characters).")]
TextField = Annotated[str, typer.Option(rich_help_panel=TEXT, help="The field that holds a row's text.")]
Split = Annotated[str, typer.Option(rich_help_panel=TEXT, help="The split of a named dataset.")]
Streaming = Annotated[bool, typer.Option(
    "--streaming", rich_help_panel=TEXT,
    help="Read a dataset as it downloads, only until --max-tokens tokens (needs --max-tokens).")]
Difficulty = Annotated[Optional[Literal[tuple(DIFFICULTIES)]], typer.Option(
    rich_help_panel=SUDOKU, show_default=False,
    help=f"The puzzles' difficulty (default {SUDOKU_DEFAULTS['difficulty']}): {_difficulties()}.")]
Preset = Annotated[Optional[Literal[tuple(sorted(PRESET_TASKS))]], typer.Option(
    rich_help_panel=SUDOKU, show_default=False, help="A named data set of the HRM and TRM guides (implies its --task).")]
Aug = Annotated[int, typer.Option(min=0, rich_help_panel=SUDOKU, help="Augmented copies of each train puzzle (a "
                                                                      "maze's: rotations and reflections, at most 7).")]
Workers = Annotated[int, typer.Option(min=1, rich_help_panel=SUDOKU, help="Processes that generate puzzles.")]
Seed = Annotated[int, typer.Option(help="The seed of everything drawn at random.")]


def prepare_data(
        ctx: typer.Context, source: Source = None, task: Task = None, out: Out = None,
        vocab_size: VocabSize = 8192,
        tokenizer: Text("Use this tokenizer (a directory transformers can load) instead of training one.",
                        metavar="DIR") = None,
        max_tokens: Count("Stop at this many tokens.") = None,
        min_text_length: MinLength = 0,
        max_text_length: Count("Drop texts longer than this (characters).", least=0) = None,
        text_field: TextField = "text", split: Split = "train",
        config: Text("The configuration of a named dataset (or of a local dataset directory): C4's en, "
                     "Wikipedia's 20231101.es.") = None,
        streaming: Streaming = False, dtype: Dtype = "auto", shard_tokens: ShardTokens = 100_000_000,
        difficulty: Difficulty = None,
        train: Count(f"Train puzzles (default {SUDOKU_DEFAULTS['train']}; mazes {MAZE_DEFAULTS['train']}).", SUDOKU) = None,
        test: Count(f"Held-out test puzzles, never augmented, no transform of a train puzzle (default "
                    f"{SUDOKU_DEFAULTS['test']}; stored as the split 'val').", SUDOKU) = None,
        aug: Aug = 0,
        from_csv: Text("Read the puzzles from a file instead: 81 characters a line (. or 0 a blank), its solution "
                       "after a comma or found by the solver; or a CSV with a question column "
                       "(source,question,answer,rating).", SUDOKU, "FILE") = None,
        test_csv: Text("The test puzzles from this CSV (with --from-csv).", SUDOKU, "FILE") = None,
        preset: Preset = None, workers: Workers = 2,
        count: Count("Puzzles with a givens range (--min-givens, --max-givens) instead of a difficulty.", SUDOKU,
                     None) = None,
        min_givens: Count("The fewest givens (with --count).", SUDOKU, None) = None,
        max_givens: Count("The most givens (with --count).", SUDOKU, None) = None,
        seed: Seed = 0) -> int:
    """Turn a corpus (or generated sudoku puzzles or mazes) into training shards and a manifest.

    `hrmctl prepare-data corpus.txt` (into data/lm), `hrmctl prepare-data --task sudoku` (into data/sudoku),
    `hrmctl prepare-data --preset maze-30x30-hard-1k --out data/maze-30x30-hard-1k` (Maze-Hard's like).
    The guides' spellings are read as ours: AuraLM's `--dataset-name X --dataset-max-tokens N`, the HRM guide's options.
    Nothing is written unless everything is; the same input with the same options is no work."""
    notes = [f"hrmctl: read as ours: {'; '.join(ctx.meta[SAID])}"] if ctx.meta.get(SAID) else []
    if task is None:
        task = PRESET_TASKS.get(preset, "lm")
    if out is None:
        out = Path("data") / task
        notes.append(f"out: {out} (no --out: the data directory hrmctl train reads for task={task})")
    with user_errors():
        from auralm import tasks

        line = tasks.get(task).prepare(source, out, dict(
            vocab_size=vocab_size, tokenizer=tokenizer, max_tokens=max_tokens,
            min_text_length=min_text_length, max_text_length=max_text_length, text_field=text_field, split=split,
            config=config, streaming=streaming, dtype=dtype, shard_tokens=shard_tokens, difficulty=difficulty,
            train=train, test=test, aug=aug, from_csv=from_csv, test_csv=test_csv, preset=preset, workers=workers,
            count=count, min_givens=min_givens, max_givens=max_givens, seed=seed))
    for note in notes:  # how the line was read: once it has worked (a bad input is one line, the error's)
        print(note, file=sys.stderr, flush=True)
    print(line, flush=True)
    return 0
