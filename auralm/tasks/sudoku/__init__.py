"""task=sudoku: 9x9 grids, 81 cells of 0 (blank) to 9; the targets are the blanks' digits minus 1 (9 classes),
-100 on the givens. A grid counts as solved when every blank is right. A run with no data_dir makes the embedded
default data (auralm.data.prepare_choices.SUDOKU_DEFAULTS)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from auralm.tasks import Grid

if TYPE_CHECKING:
    from auralm.models.args import ModelArgs

CELLS, DIGITS = 81, 9


class Sudoku(Grid):
    name = "sudoku"
    augment = True
    prepare_hint = ""  # generated: no SOURCE

    def prepare_command(self, out: str) -> str:
        """A directory named like a preset (data/sudoku-extreme-small) with that --preset."""
        import os
        import shlex

        from auralm.data.prepare_choices import PRESETS

        name = os.path.basename(out.rstrip("/"))
        preset = f" --preset {name}" if name in PRESETS else ""
        return f"hrmctl prepare-data --task sudoku{preset} --out {shlex.quote(out)}"

    def prepare(self, source: str | None, out: Path, options: dict) -> str:
        """Puzzles generated (a preset, a difficulty, or a count of givens) or read from a CSV, split into train and
        held-out test puzzles."""
        from auralm.data import datadir
        from auralm.data.prepare_choices import PRESET_TASKS, PRESETS, SUDOKU_DEFAULTS
        from auralm.errors import UserError

        o = options
        if o["preset"] and o["preset"] not in PRESETS:
            raise UserError(f"--preset {o['preset']} is task {PRESET_TASKS[o['preset']]}'s data: drop --task sudoku")
        if o["config"] or o["streaming"]:
            raise UserError("--config and --streaming read a text dataset: not for --task sudoku")
        if source:
            raise UserError("--task sudoku takes no SOURCE: the puzzles are generated (or --from-csv FILE)")
        if o["count"] is None and (o["min_givens"] is not None or o["max_givens"] is not None):
            raise UserError("--min-givens/--max-givens go with --count N (or use --difficulty)")
        opts = dict(PRESETS[o["preset"]]) if o["preset"] else dict(SUDOKU_DEFAULTS)
        opts.update({k: o[k] for k in ("train", "test", "difficulty") if o[k] is not None})
        if o["aug"]:
            opts["aug"] = o["aug"]
        opts["seed"] = o["seed"]
        if o["count"] is not None:
            opts.update(count=o["count"], min_givens=o["min_givens"], max_givens=o["max_givens"])
        return datadir.prepare_sudoku(out, from_csv=o["from_csv"], test_csv=o["test_csv"], workers=o["workers"],
                                      **opts)

    def length(self, arch: ModelArgs) -> int:
        return CELLS

    def values(self, vocab: int | None) -> int:
        return DIGITS + 1  # 0, a blank, and the digits

    def classes(self, vocab: int | None) -> int:
        return DIGITS

    def default_rows(self) -> tuple[int, int]:
        from auralm.data.prepare_choices import SUDOKU_DEFAULTS

        return SUDOKU_DEFAULTS["train"], SUDOKU_DEFAULTS["test"]

    def make_default(self, data_dir: Path) -> None:
        from auralm.data import datadir

        datadir.ensure_sudoku(data_dir)

    def open_split(self, data_dir: Path, meta: dict, split: str, block_size: int):
        from auralm.data import datadir

        return datadir.Puzzles(data_dir, meta, split)

    def open_file(self, path: str):
        """Puzzles a line or a CSV (auralm.data.puzzle_file: the solver solves those given without a solution)."""
        import numpy as np

        from auralm.data import datadir
        from auralm.data.puzzle_file import PuzzleFileError, read_puzzles
        from auralm.errors import UserError

        try:
            rows = read_puzzles(path)
        except PuzzleFileError as e:
            raise UserError(str(e)) from None
        return datadir.Puzzles.of(np.array([[p, s] for p, s, _ in rows], np.uint8))

    def random_batch(self, arch: ModelArgs, vocab: int | None, batch: int, device):
        """About half of the cells given; targets digit - 1, -100 on the givens, as auralm.data.datadir makes them."""
        import torch

        g = torch.Generator().manual_seed(0)
        x = torch.randint(0, DIGITS + 1, (batch, CELLS), generator=g) * (torch.rand(batch, CELLS, generator=g) < 0.5)
        y = torch.randint(0, DIGITS, (batch, CELLS), generator=g).masked_fill(x != 0, -100)
        return x.to(device), y.to(device)

    def targets(self, x, y):
        """The given digit (minus 1) where ``y`` has no target: the recurrent models learn every cell."""
        import torch

        from auralm.models.layers import IGNORE

        return torch.where(y == IGNORE, x - 1, y)
