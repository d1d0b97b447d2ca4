"""task=maze (auralm/tasks/maze): the generator makes mazes with one shortest path of the length asked, the solver
finds it and refuses a maze without a single answer, the eight symmetries keep a maze's answer its answer,
`hrmctl prepare-data --preset maze-30x30-hard-1k` writes the data (and refuses what is not for mazes in one line), and
a real short TRM run trains on it and `hrmctl eval` scores it, on its split and on a file of the public set's form."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest

from auralm.tasks.maze import mazes


def _path_ok(question, answer, moves):
    """The answer marks a chain of open cells from the start to the goal, ``moves`` long, and nothing else."""
    assert [i for i, (q, a) in enumerate(zip(question, answer)) if q != a] == \
        [i for i, a in enumerate(answer) if a == mazes.PATH]
    on = {i for i, a in enumerate(answer) if a in (mazes.PATH, mazes.START, mazes.GOAL)}
    start, goal = question.index(mazes.START), question.index(mazes.GOAL)
    assert len(on) == moves + 1
    seen, edge = {start}, [start]
    while edge:
        edge = [v for u in edge for v in mazes.NEIGHBOURS[u] if v in on and v not in seen]
        seen.update(edge)
    assert goal in seen and seen == on


def test_generated_mazes_have_one_shortest_path_as_long_as_asked_and_the_solver_finds_it():
    made = mazes.generate(12, seed=3, min_path=80, loops=10)
    assert made == mazes.generate(12, seed=3, min_path=80, loops=10)  # the seed decides
    assert len({mazes.canonical(np.array(q, np.uint8)) for q, _, _ in made}) == 12  # no two alike, turned or not
    for question, answer, moves in made:
        assert len(question) == mazes.CELLS and moves >= 80
        assert question.count(mazes.START) == question.count(mazes.GOAL) == 1 and mazes.PATH not in question
        _path_ok(question, answer, moves)
        assert mazes.solve(question) == (answer, moves)
        assert mazes.encode(mazes.decode(answer)) == answer


def test_a_maze_without_a_single_answer_is_refused_with_why():
    open_room = [mazes.OPEN] * mazes.CELLS  # no walls: many shortest paths between two corners
    open_room[0], open_room[-1] = mazes.START, mazes.GOAL
    with pytest.raises(mazes.MazeError, match="more than one shortest path"):
        mazes.solve(open_room)
    walled = list(open_room)
    walled[mazes.SIZE: 2 * mazes.SIZE] = [mazes.WALL] * mazes.SIZE  # a wall across the second row
    with pytest.raises(mazes.MazeError, match="cannot be reached"):
        mazes.solve(walled)
    with pytest.raises(mazes.MazeError, match="one start S and one goal G"):
        mazes.solve([mazes.OPEN] * mazes.CELLS)
    with pytest.raises(mazes.MazeError, match="'x' is not a maze's character"):
        mazes.encode("# x")


def test_each_symmetry_keeps_a_mazes_answer_its_answer():
    made = mazes.generate(6, seed=5, min_path=60, loops=10)
    records = np.array([[q, a] for q, a, _ in made], np.uint8)
    turned = mazes.transform_batch(records, np.random.default_rng(0))
    copies = mazes.symmetric_copies(records, 7)
    assert len(copies) == 7 * len(records)
    for q, a in np.concatenate([turned, copies]).tolist():
        assert mazes.solve(q)[0] == a
    keys = {mazes.canonical(r[0]) for r in copies}
    assert keys == {mazes.canonical(r[0]) for r in records}  # a copy is its maze under a symmetry
    assert {r[0].tobytes() for r in copies}.isdisjoint({r[0].tobytes() for r in records})


@pytest.fixture
def tool(monkeypatch, capsys):
    """tool(command, *args): ``hrmctl command args`` in this process: (exit code, stdout, stderr)."""
    from cli.app import main

    def call(command: str, *args: str):
        capsys.readouterr()
        code = main([command, *args])
        got = capsys.readouterr()
        return code, got.out, got.err

    return call


def test_prepare_data_preset_writes_maze_data_and_refuses_what_is_not_for_mazes(tool, tmp_path):
    from auralm.data import datadir

    out = tmp_path / "maze-30x30-hard-1k"
    code, stdout, stderr = tool("prepare-data", "--preset", "maze-30x30-hard-1k", "--train", "12", "--test", "6",
                                "--aug", "3", "--out", str(out))  # the preset implies --task maze
    assert code == 0, stderr
    assert stdout.strip() == (f"wrote 12 train mazes x 4 with rotated and reflected copies and 6 held-out test mazes "
                              f"(30x30) to {out}")
    meta = datadir.load_manifest(out, "maze")
    assert meta["splits"]["train"]["puzzles"] == 48 and meta["splits"]["val"]["puzzles"] == 6
    assert meta["path_moves"]["min"] >= 111 and meta["charset"] == "# SGo"  # the preset's filter
    from auralm import tasks

    train = tasks.open_split(out, meta, "train", 0)
    x, y = train.batch(range(48))
    assert x.shape == y.shape == (48, mazes.CELLS) and int(x.max()) <= mazes.GOAL and int(y.max()) == mazes.PATH
    for q, a in zip(x.tolist(), y.tolist()):
        assert mazes.solve(q)[0] == a
    assert tool("prepare-data", "--preset", "maze-30x30-hard-1k", "--train", "12", "--test", "6", "--aug", "3",
                "--out", str(out))[1].strip() == f"up to date: {out}"
    for args, line in [
        (["--task", "sudoku", "--preset", "maze-30x30-hard-1k"], "--preset maze-30x30-hard-1k is task maze's data: "
                                                                 "drop --task sudoku"),
        (["--task", "maze", "--preset", "sudoku-medium"], "--preset sudoku-medium is task sudoku's data: drop --task "
                                                          "maze"),
        (["--task", "maze", "--difficulty", "hard"], "--difficulty is not an option of --task maze"),
        (["--task", "maze", "--aug", "8"], "--aug 8: a maze has 7 rotations and reflections besides itself: 0 to 7"),
        (["--task", "maze", "corpus.txt"], "--task maze takes no SOURCE"),
    ]:
        code, stdout, stderr = tool("prepare-data", *args, "--out", str(tmp_path / "bad"))
        assert code != 0 and line in stderr and "Traceback" not in stderr and len(stderr.strip().splitlines()) == 1, \
            (args, stderr)
    assert not (tmp_path / "bad").exists()


@pytest.mark.slow
def test_a_trm_run_trains_on_mazes_and_eval_scores_its_split_and_a_public_form_file(tool, tmp_path):
    from auralm.tasks.maze import prepare
    from auralm.training import train
    from auralm.training.config import parse

    data = tmp_path / "mazes"
    prepare(data, train=24, test=8, min_path=60, loops=10, seed=1)
    out = tmp_path / "run"
    train.run(parse([f"data_dir={data}", f"out_dir={out}", "task=maze", "model=trm-tiny", "model.n_embd=32",
                     "model.eval_segments=2", "training.batch_size=4", "training.max_steps=3",
                     "training.eval_interval=0"]))
    code, stdout, stderr = tool("eval", str(out), "--json")
    assert code == 0, stderr
    split = json.loads(stdout)
    assert split["examples"] == 8 and set(split["ci95"]) >= {"exact_accuracy", "cell_acc"}
    assert 0 < split["cell_acc"] <= 1 and 0 <= split["exact_accuracy"] <= 1
    # the same mazes as a file: the public set's CSV with answers, and lines without (the solver answers them)
    records = _val(data).records
    rows = [(mazes.decode(q), mazes.decode(a)) for q, a in records.tolist()]
    public = tmp_path / "test.csv"
    public.write_text("source,question,answer,rating\n" + "".join(f"gen,{q},{a},{random.randint(111, 200)}\n"
                                                                 for q, a in rows))
    bare = tmp_path / "questions.txt"
    bare.write_text("".join(f"{q}\n" for q, _ in rows))
    for path in (public, bare):
        code, stdout, stderr = tool("eval", str(out), "--puzzles", str(path), "--json")
        assert code == 0, stderr
        got = json.loads(stdout)
        for key in ("examples", "exact_accuracy", "cell_acc", "ci95"):
            assert got[key] == split[key], (path, key)
    bad = tmp_path / "bad.csv"
    bad.write_text("source,question,answer,rating\n" + f"gen,{rows[0][0]},{rows[0][0].replace(' ', '#', 1)},1\n")
    code, stdout, stderr = tool("eval", str(out), "--puzzles", str(bad))
    assert code != 0 and stderr.strip() == (f"error: {bad} line 2: the answer is not its question with the path marked "
                                            "o: another cell differs"), stderr
    code, stdout, stderr = tool("solve", str(out), str(bare))  # sudoku's grids only: it says what scores a maze
    assert code == 2 and "is a task=maze model, not a sudoku model (`hrmctl eval" in stderr and "--puzzles FILE` " \
        "scores it on a file of its puzzles)" in stderr, stderr


def _val(data):
    from auralm import tasks
    from auralm.data import datadir

    return tasks.open_split(data, datadir.load_manifest(data, "maze"), "val", 0)


def test_the_sudoku_positions_on_a_maze_are_refused_in_one_line():
    from auralm.errors import UserError
    from auralm.training import config

    with pytest.raises(UserError, match=r"^model=trm-tiny with pos_encodings=sudoku needs a sudoku grid's 81 cells; on "
                                        r"task=maze use model.pos_encodings=rope \(or auto\)$"):
        config.parse(["task=maze", "model=trm-tiny", "model.pos_encodings=sudoku"])
    assert config.parse(["task=maze", "model=trm-tiny"]).task == "maze"  # auto: rotary on a maze


def test_prepare_data_from_the_public_csv_splits_its_mazes(tool, tmp_path):
    made = mazes.generate(20, seed=9, min_path=60, loops=10)
    csv = tmp_path / "train.csv"
    csv.write_text("source,question,answer,rating\n" + "".join(f"gen,{mazes.decode(q)},{mazes.decode(a)},{n}\n"
                                                               for q, a, n in made))
    code, stdout, stderr = tool("prepare-data", "--task", "maze", "--from-csv", str(csv), "--out", str(tmp_path / "d"))
    assert code == 0, stderr  # no counts given: a tenth of the file held out
    assert stdout.strip().startswith("wrote 18 train mazes and 2 held-out test mazes"), stdout
    code, stdout, stderr = tool("prepare-data", "--task", "maze", "--from-csv", str(csv), "--test-csv", str(csv),
                                "--test", "5", "--out", str(tmp_path / "e"))
    assert code != 0 and stderr.strip() == ("error: every one of the 5 test mazes is a train maze, or one turned or "
                                            "mirrored: give test mazes of their own (--test-csv) or fewer train mazes "
                                            "(--train)"), stderr  # never a data directory without a test split
    assert not (tmp_path / "e").exists()
