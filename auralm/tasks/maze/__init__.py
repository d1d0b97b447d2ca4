"""task=maze: Maze-Hard, 30x30 mazes (auralm/tasks/maze/mazes.py). A sample is the maze's 900 cells (a wall, an
open cell, the start, the goal); the target of every cell is the answer's: the same cell, or ``o`` on the shortest
path. Every cell is scored, as the public HRM and TRM code score it, and a maze counts as solved when all 900 are
right (exact accuracy). ``training.augment`` turns each maze by one of a square's eight symmetries. A run with no
data_dir makes the default data (``MAZE_DEFAULTS``: like the public set, 1000 train and 1000 test mazes)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from auralm.tasks import Grid
from auralm.tasks.maze import mazes

if TYPE_CHECKING:
    from auralm.models.args import ModelArgs

NOT_FOR_MAZES = (("difficulty", "--difficulty"), ("count", "--count"), ("min_givens", "--min-givens"),
                 ("max_givens", "--max-givens"), ("config", "--config"), ("streaming", "--streaming"))


def _question(text: str) -> list[int] | None:
    text = text.rstrip("\r\n")  # a space is an open cell: nothing else is stripped
    if len(text) != mazes.CELLS or any(ch not in mazes.CHARSET[:4] for ch in text):
        return None
    return mazes.encode(text)


def _answer(text: str, question: list[int]) -> list[int]:
    text = text.rstrip("\r\n")
    if len(text) != mazes.CELLS:
        raise ValueError(f"the answer is not {mazes.CELLS} characters")
    try:
        answer = mazes.encode(text)
    except mazes.MazeError as e:
        raise ValueError(f"the answer: {e}") from None
    if any(q != a and a != mazes.PATH for q, a in zip(question, answer)):
        raise ValueError("the answer is not its question with the path marked o: another cell differs")
    return answer


def _solve(question: list[int]) -> tuple[list[int] | None, str]:
    try:
        return mazes.solve(question)[0], ""
    except mazes.MazeError as e:
        return None, str(e)


def file_form():
    from auralm.data.puzzle_file import Form

    return Form(f"{mazes.CELLS} characters of {mazes.CHARSET[:4]!r} ({mazes.SIZE}x{mazes.SIZE}: a wall, an open "
                f"cell, the start, the goal)", _question, _answer, _solve)


class Maze(Grid):
    name = "maze"
    augment = True

    def prepare_command(self, out: str) -> str:
        """A directory named like the public set (TRM's data_paths=[data/maze-30x30-hard-1k]) with that --preset."""
        import os
        import shlex

        from auralm.data.prepare_choices import MAZE_PRESETS

        name = os.path.basename(out.rstrip("/"))
        what = f"--preset {name}" if name in MAZE_PRESETS else "--task maze"
        return f"hrmctl prepare-data {what} --out {shlex.quote(out)}"

    def prepare(self, source: str | None, out: Path, options: dict) -> str:
        """Mazes generated (``MAZE_DEFAULTS``, or a preset) or read from a file of the public set's form, split into
        train and held-out test mazes."""
        from auralm.data.prepare_choices import MAZE_DEFAULTS, MAZE_PRESETS, PRESET_TASKS
        from auralm.errors import UserError

        o = options
        if source:
            raise UserError("--task maze takes no SOURCE: the mazes are generated (or --from-csv FILE)")
        given = [flag for key, flag in NOT_FOR_MAZES if o.get(key)]
        if given:
            raise UserError(f"{given[0]} is not an option of --task maze (it takes --train, --test, --aug, --seed, "
                            f"--preset, --from-csv, --test-csv)")
        if o["preset"] and o["preset"] not in MAZE_PRESETS:
            raise UserError(f"--preset {o['preset']} is task {PRESET_TASKS[o['preset']]}'s data: drop --task maze")
        opts = dict(MAZE_PRESETS[o["preset"]] if o["preset"] else MAZE_DEFAULTS)
        if o["from_csv"]:  # the file's mazes: the test split of --test-csv, else a tenth, unless a count is given
            opts.update(train=o["train"], test=o["test"])
        else:
            opts.update({k: o[k] for k in ("train", "test") if o[k] is not None})
        if o["aug"]:
            opts["aug"] = o["aug"]
        return prepare(out, from_csv=o["from_csv"], test_csv=o["test_csv"], workers=o["workers"],
                       **dict(opts, seed=o["seed"]))

    def length(self, arch: ModelArgs) -> int:
        return mazes.CELLS

    def values(self, vocab: int | None) -> int:
        return len(mazes.CHARSET)

    def classes(self, vocab: int | None) -> int:
        return len(mazes.CHARSET)

    def default_rows(self) -> tuple[int, int]:
        from auralm.data.prepare_choices import MAZE_DEFAULTS

        return MAZE_DEFAULTS["train"], MAZE_DEFAULTS["test"]

    def make_default(self, data_dir: Path) -> None:
        from auralm.data import datadir
        from auralm.data.prepare_choices import MAZE_DEFAULTS

        datadir.ensure(data_dir, self.name, lambda: prepare(data_dir, **MAZE_DEFAULTS))

    def open_split(self, data_dir: Path, meta: dict, split: str, block_size: int):
        import numpy as np

        return Mazes(np.concatenate([np.fromfile(data_dir / f, dtype=np.uint8).reshape(-1, 2, mazes.CELLS)
                                     for f in meta["splits"][split]["files"]]))

    def open_file(self, path: str):
        """Mazes a line or a CSV of the public form (auralm.data.puzzle_file; those without an answer solved)."""
        import numpy as np

        from auralm.data.puzzle_file import PuzzleFileError, read_puzzles
        from auralm.errors import UserError

        try:
            rows = read_puzzles(path, form=file_form())
        except PuzzleFileError as e:
            raise UserError(str(e)) from None
        return Mazes(np.array([[q, a] for q, a, _ in rows], np.uint8))

    def random_batch(self, arch: ModelArgs, vocab: int | None, batch: int, device):
        """Walls and open cells at random, a few marked as the path in the targets."""
        import torch

        g = torch.Generator().manual_seed(0)
        x = torch.randint(mazes.WALL, mazes.OPEN + 1, (batch, mazes.CELLS), generator=g)
        y = torch.where((x == mazes.OPEN) & (torch.rand(batch, mazes.CELLS, generator=g) < 0.2), mazes.PATH, x)
        return x.to(device), y.to(device)


class Mazes:
    """The mazes of a split, (n, 2, CELLS) uint8 records: the question, the answer."""

    unit = "puzzles"

    def __init__(self, records):
        self.records = records

    def __len__(self) -> int:
        return len(self.records)

    def batch(self, indices, rng=None):
        """Inputs and targets (every cell's answer); with ``rng``, each maze turned by its own symmetry."""
        import numpy as np
        import torch

        records = self.records[np.asarray(indices)]
        if rng is not None:
            records = mazes.transform_batch(records, rng)
        rec = torch.from_numpy(records.astype(np.int64))
        return rec[:, 0], rec[:, 1]

    def units(self, x) -> int:
        return x.shape[0]


def prepare(out: Path, train: int | None, test: int | None, min_path: int, loops: int, aug: int = 0, seed: int = 0,
            from_csv: str | None = None, test_csv: str | None = None, workers: int = 2) -> str:
    """Write a maze data directory: ``train`` mazes (each with ``aug`` rotated or reflected copies) and ``test``
    held-out ones (the split ``val``), generated or read from ``from_csv`` (and ``test_csv``). No test maze is a
    rotation or reflection of a train maze."""
    import numpy as np

    from auralm.data import datadir
    from auralm.errors import UserError

    if not 0 <= aug <= 7:
        raise UserError(f"--aug {aug}: a maze has 7 rotations and reflections besides itself: 0 to 7")
    sources = datadir.puzzle_files(from_csv, test_csv, "mazes")
    options = dict(train=train, test=test, min_path=None if from_csv else min_path, loops=None if from_csv else loops,
                   aug=aug, seed=seed, csv=[(Path(f).name, datadir.sha256_file(Path(f))) for f in sources] or None)
    fp = datadir.fingerprint({"format": datadir.FORMAT, "task": "maze", "options": options})
    if datadir.up_to_date(out, fp):
        return f"up to date: {out}"
    if from_csv:
        train_rows, test_rows = datadir.read_splits(from_csv, test_csv, train, test, seed, workers, file_form(),
                                                    "mazes")
    else:
        made = mazes.generate(train + test, seed, min_path, loops)
        test_rows, train_rows = made[:test], made[test:]
    seen = {mazes.canonical(np.array(q, np.uint8)) for q, *_ in train_rows}
    kept = [r for r in test_rows if mazes.canonical(np.array(r[0], np.uint8)) not in seen]
    leaks, test_rows = len(test_rows) - len(kept), kept
    if not test_rows:
        raise UserError(f"every one of the {leaks} test mazes is a train maze, or one turned or mirrored: give test "
                        f"mazes of their own (--test-csv) or fewer train mazes (--train)")

    def fill(tmp: Path) -> None:
        base = np.array([[q, a] for q, a, _ in train_rows], np.uint8)
        np.concatenate([base, mazes.symmetric_copies(base, aug)]).tofile(tmp / "train_000.bin")
        np.array([[q, a] for q, a, _ in test_rows], np.uint8).tofile(tmp / "val_000.bin")
        moves = [sum(v == mazes.PATH for v in a) + 1 for _, a, _ in train_rows + test_rows]
        splits = {"train": {"files": ["train_000.bin"], "puzzles": len(base) * (aug + 1), "base_puzzles": len(base)},
                  "val": {"files": ["val_000.bin"], "puzzles": len(test_rows)}}
        source = {"csv": [Path(f).name for f in sources]} if from_csv else {"generator": "auralm.tasks.maze.mazes"}
        datadir.write_manifest(tmp, "maze", splits, dtype="uint8", record=[2, mazes.CELLS], options=options,
                               source=source, fingerprint=fp, leaks_removed=leaks, charset=mazes.CHARSET,
                               path_moves={"min": min(moves), "mean": round(sum(moves) / len(moves), 2),
                                           "max": max(moves)})

    datadir.write_atomically(out, fill)
    copies = f" x {aug + 1} with rotated and reflected copies" if aug else ""
    dropped = f"; {leaks} test mazes were rotations or reflections of train mazes and are left out" if leaks else ""
    return (f"wrote {len(train_rows)} train mazes{copies} and {len(test_rows)} held-out test mazes "
            f"({mazes.SIZE}x{mazes.SIZE}) to {out}{dropped}")
