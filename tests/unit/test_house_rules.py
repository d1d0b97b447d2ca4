"""The house's rules that the code itself can be asked about (issue 35; ../shared/DESIGN.md): no function in
auralm/, cli/ or netcheck/ longer than 100 lines and the trainer's ``train()`` at most 80, and the arrows one way
(``auralm`` and ``netcheck`` never import ``cli``; ``netcheck`` never imports ``auralm``: its node probe is sent
over SSH to nodes where nothing of ours is installed)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ROOMS = ("auralm", "cli", "netcheck")


def _modules(room: str):
    for path in sorted((REPO / room).rglob("*.py")):
        yield path.relative_to(REPO), ast.parse(path.read_text(), str(path))


def _functions(tree: ast.AST):
    return [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]


def _imported_rooms(tree: ast.AST) -> set[str]:
    names = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Import):
            names |= {a.name.split(".")[0] for a in n.names}
        elif isinstance(n, ast.ImportFrom) and n.level == 0 and n.module:
            names.add(n.module.split(".")[0])
    return names & set(ROOMS)


def test_no_function_is_longer_than_100_lines_and_train_at_most_80():
    long = [f"{path}:{f.lineno} {f.name} ({f.end_lineno - f.lineno + 1} lines)"
            for room in ROOMS for path, tree in _modules(room) for f in _functions(tree)
            if f.end_lineno - f.lineno + 1 > 100]
    assert long == [], long
    tree = ast.parse((REPO / "auralm" / "training" / "train.py").read_text())
    [train] = [f for f in _functions(tree) if f.name == "train"]
    assert train.end_lineno - train.lineno + 1 <= 80


@pytest.mark.parametrize("room, never", [("auralm", {"cli"}), ("netcheck", {"cli", "auralm"})])
def test_the_arrows_point_one_way(room, never):
    wrong = [f"{path} imports {sorted(_imported_rooms(tree) & never)}" for path, tree in _modules(room)
             if _imported_rooms(tree) & never]
    assert wrong == [], wrong
