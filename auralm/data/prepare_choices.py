"""The values ``hrmctl prepare-data``'s options take, in the standard library alone: the command line's help and
completion list them without importing numpy or torch (cli/tools/prepare_data.py), the preparer reads the same
tables (``datadir``, ``sudoku``).

- ``DTYPES``: the token shards' widths (``--dtype``). (``--task`` takes the registered tasks: auralm.tasks.)
- ``DIFFICULTIES``: sudoku's difficulties, each with its range of givens (``extreme`` is also rated: sudoku.py).
- ``SUDOKU_DEFAULTS``: the embedded default data set (a run with no data_dir makes it); ``PRESETS``: the named data
  sets of the HRM guides (``--preset``).
- ``MAZE_DEFAULTS``: task=maze's data, named like the public Maze-Hard set (``MAZE_PRESETS``); ``PRESET_TASKS``: the
  task each ``--preset`` is of (prepare-data's ``--task`` when the line gives none).
"""

from __future__ import annotations

DTYPES = ("auto", "uint16", "uint32")

# name -> (min givens, max givens); extreme is also rated (see sudoku.make_puzzle)
DIFFICULTIES = {"easy": (50, 60), "medium": (30, 36), "hard": (26, 29), "extreme": (17, 25)}

SUDOKU_DEFAULTS = dict(difficulty="medium", train=3000, test=1000, aug=0, seed=0)  # the embedded default

PRESETS = {  # named like the HRM guide's data sets; with --from-csv they are read from the public CSVs instead
    "sudoku-extreme-1k-aug-1000": dict(difficulty="extreme", train=1000, test=1000, aug=1000),
    "sudoku-extreme-small": dict(difficulty="extreme", train=200, test=100, aug=20),
    "sudoku-medium": dict(SUDOKU_DEFAULTS),
}

# like the public Maze-Hard set: 30x30 mazes whose shortest path is longer than 110 moves, 1000 train and 1000 test
# (auralm/tasks/maze/mazes.py); aug: rotated or reflected copies of each train maze (at most 7)
MAZE_DEFAULTS = dict(train=1000, test=1000, min_path=111, loops=10, aug=0, seed=0)
MAZE_PRESETS = {"maze-30x30-hard-1k": dict(MAZE_DEFAULTS)}
PRESET_TASKS = {**{name: "sudoku" for name in PRESETS}, **{name: "maze" for name in MAZE_PRESETS}}
