"""The house's rules that the code itself can be asked about (issue 35; ../shared/DESIGN.md): no function in
auralm/, cli/, netcheck/ or node/ longer than 100 lines and the trainer's ``train()`` at most 80, the arrows one
way (``auralm`` imports neither ``cli`` nor ``netcheck``; ``netcheck`` never imports ``cli`` or ``auralm``; ``node``
is sent over SSH to nodes where nothing of ours is installed: it imports the standard library, and torch, psutil or
pynvml only where a node has them; cli/launch's stages import one way, plan -> preflight -> run -> supervise; the
guides' spellings read at the edge: auralm/guides imported by auralm.training.command_line alone), and a
name tested only by its owner (issue 64): no module outside a sync mode's, a task's or a model family's own file or
folder compares a value with its name."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ROOMS = ("auralm", "cli", "netcheck", "node")


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


@pytest.mark.parametrize("room, never", [("auralm", {"cli", "netcheck"}), ("netcheck", {"cli", "auralm"}),
                                         ("node", {"cli", "netcheck", "auralm"})])
def test_the_arrows_point_one_way(room, never):
    wrong = [f"{path} imports {sorted(_imported_rooms(tree) & never)}" for path, tree in _modules(room)
             if _imported_rooms(tree) & never]
    assert wrong == [], wrong


def _imported_modules(tree: ast.AST) -> set[str]:
    """Every module a tree imports, anywhere in it, by its full name (``from auralm import guides``: auralm.guides)."""
    names = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Import):
            names |= {a.name for a in n.names}
        elif isinstance(n, ast.ImportFrom) and n.level == 0 and n.module:
            names |= {n.module} | {f"{n.module}.{a.name}" for a in n.names}
    return names


GUIDES = "auralm.guides"
READS_GUIDES = {Path("auralm/training/command_line.py")}  # the one way from a command line to a Config


def guide_imports(path: Path, tree: ast.AST) -> list[str]:
    """The wrong imports of a module of auralm/ about the guides: of the guides by a module other than the command
    line's (the config core, the model families, anything), or, by the guides, of what stands after them."""
    names = _imported_modules(tree)
    if path.parts[:2] == ("auralm", "guides"):
        return sorted(n for n in names if n.startswith(("auralm.training.command_line", "auralm.training.train", "cli")))
    if path in READS_GUIDES:
        return []
    return sorted(n for n in names if n == GUIDES or n.startswith(GUIDES + "."))


def test_the_guides_spellings_are_read_at_the_edge():
    """Issue 64, item 5: other projects' spellings are translated once, before the config reads a command line
    (auralm/guides, called by auralm.training.command_line alone); auralm/training/config.py, the recipes and the
    model families import nothing of them, and the guides nothing of what calls them."""
    wrong = [f"{path} imports {name}" for path, tree in _modules("auralm") for name in guide_imports(path, tree)]
    assert wrong == [], wrong
    assert guide_imports(Path("auralm/training/config.py"), ast.parse("from auralm import guides")) == [GUIDES]
    assert guide_imports(Path("auralm/models/hrm/spec.py"), ast.parse("def f():\n    import auralm.guides.implied")) \
        == ["auralm.guides.implied"]
    assert guide_imports(Path("auralm/guides/x.py"), ast.parse("from auralm.training import command_line, config")) \
        == ["auralm.training.command_line"]


STAGES = ("plan", "preflight", "run", "supervise")  # cli/launch/'s packages, in the order a launch goes through them


def later_stages(stage: str, tree: ast.AST) -> list[str]:
    """The cli.launch modules that a module of ``stage`` imports (anywhere in it, a function's import too) and may
    not: a later stage's, or the command's."""
    names = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Import):
            names |= {a.name for a in n.names}
        elif isinstance(n, ast.ImportFrom) and n.level == 0 and n.module:
            names |= {f"cli.launch.{a.name}" for a in n.names} if n.module == "cli.launch" else {n.module}
    allowed = STAGES[: STAGES.index(stage) + 1]
    return sorted(x for x in names if x.startswith("cli.launch.") and x.split(".")[2] not in allowed)


def test_the_launch_stages_import_one_way():
    """cli/launch/ is a package per stage (plan -> preflight -> run -> supervise) and command.py, which calls them in
    order: a stage's module imports its own stage and the earlier ones, never a later one nor the command."""
    root = REPO / "cli" / "launch"
    assert sorted(p.name for p in root.glob("*.py")) == ["__init__.py", "command.py"]
    assert sorted(p.parent.name for p in root.glob("*/__init__.py")) == sorted(STAGES)
    modules = [(stage, path) for stage in STAGES for path in sorted((root / stage).rglob("*.py"))]
    wrong = [f"{path.relative_to(REPO)} imports {name}" for stage, path in modules
             for name in later_stages(stage, ast.parse(path.read_text()))]
    assert wrong == [], wrong


def test_the_stage_rule_sees_an_import_of_a_later_stage():
    code = ast.parse("from cli.launch.plan import memory\nfrom cli.launch.run.attempt import RunResult\n"
                     "def f():\n    from cli.launch import command\n    import cli.launch.supervise.job\n")
    assert later_stages("supervise", code) == ["cli.launch.command"]
    assert later_stages("preflight", code) == ["cli.launch.command", "cli.launch.run.attempt",
                                               "cli.launch.supervise.job"]


OPTIONAL = {"torch", "psutil", "pynvml"}  # what a node's programs use when the node has it, never need


def _roots(stmts) -> set[str]:
    names = set()
    for n in (n for s in stmts for n in ast.walk(s)):
        if isinstance(n, ast.Import):
            names |= {a.name.split(".")[0] for a in n.names}
        elif isinstance(n, ast.ImportFrom) and n.level == 0 and n.module:
            names.add(n.module.split(".")[0])
    return names


def _at_import(stmts) -> list:
    """The statements a module runs when it is imported: its own, through if/with/try, not into functions or classes,
    nor into a ``try`` that catches ImportError (an optional import)."""
    out = []
    for s in stmts:
        if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        if isinstance(s, ast.Try) and any("ImportError" in ast.unparse(h.type or ast.Name("BaseException"))
                                          for h in s.handlers):
            out += _at_import(s.orelse + s.finalbody)
        elif isinstance(s, (ast.If, ast.With, ast.Try)):
            out += _at_import(s.body + s.orelse + getattr(s, "finalbody", []) +
                              [x for h in getattr(s, "handlers", []) for x in h.body])
        else:
            out.append(s)
    return out


def test_node_imports_the_standard_library_only():
    """node/ runs where nothing is installed (sent by node.ship): what its modules import when imported is the
    standard library's; torch, psutil and pynvml only inside a function or a try that catches ImportError."""
    std = set(sys.stdlib_module_names) | {"node"}
    needed, anywhere = set(), set()
    for _, tree in _modules("node"):
        needed |= _roots(_at_import(tree.body))
        anywhere |= _roots(tree.body)
    assert needed and needed - std == set(), needed - std
    assert anywhere - std - OPTIONAL == set(), anywhere - std - OPTIONAL


def test_the_node_rule_sees_an_import_that_is_not_optional():
    code = ast.parse("import os\ntry:\n    import psutil\nexcept ImportError:\n    psutil = None\n"
                     "if os.name:\n    import numpy\ndef f():\n    import torch\n")
    assert _roots(_at_import(code.body)) == {"os", "numpy"} and _roots(code.body) == {"os", "psutil", "numpy", "torch"}


# The built-in names and their owners, as the registries hold them (in a process of their own: the suite's other
# tests register names of their own, tests.toy_family's among them, in this one). A sync mode is owned by its class's
# module and by auralm/parallel/<name>.py or <name>/ where there is one (diloco.py, beside diloco_strategy.py); a
# task by the module or package of its class (auralm/tasks/<name>/); a family by auralm/models/<name>/.
_OWNERS = r"""
import importlib.util, json
from pathlib import Path
from auralm import tasks
from auralm.models import registry
from auralm.parallel import strategy

def source(target):
    module = target.partition(":")[0] if isinstance(target, str) else target.__module__
    origin = Path(importlib.util.find_spec(module).origin).resolve()
    return origin.parent if origin.name == "__init__.py" else origin

owners = {}
for option in strategy.OPTIONS:
    for name in strategy.names(option):
        e = strategy.entry(name) if option == "sync" else strategy.entry(strategy.DEFAULT, name)
        mine = [source(e.target), Path("auralm/parallel", name + ".py"), Path("auralm/parallel", name)]
        owners.setdefault(name, set()).update(str(p.resolve()) for p in mine)
for name in tasks.names():
    owners.setdefault(name, set()).add(str(source(tasks._REGISTRY[name].target)))
for name in registry.names():
    owners.setdefault(name, set()).add(str(Path("auralm/models", name).resolve()))
print(json.dumps({name: sorted(paths) for name, paths in owners.items()}))
"""

# What must stay, each with why: (module, the comparison as ast.unparse writes it).
NAMES_ALLOWED = {
    # model.pos_encodings=sudoku is HRM and TRM's own option value, a kind of positions (a grid's rows, columns and
    # boxes), spelled like the task it was made for: the families test their option, not the task's name
    ("auralm/models/act.py", "self.positions == 'sudoku'"),
    ("auralm/models/act.py", "self.positions != 'sudoku'"),
    ("auralm/models/recurrent.py", "arch.pos_encodings == 'sudoku'"),
    # the strategies' registry asks whether an option is at the default both options share (strategy.DEFAULT, the
    # name of DDP's registration): training.parallel at it leaves the choice to training.sync
    ("auralm/parallel/strategy.py", "parallel != DEFAULT"),
    ("auralm/parallel/strategy.py", "training.sync != DEFAULT"),
}


def _owners() -> dict[str, list[Path]]:
    """Every registered built-in sync mode, task and model family name -> the files and folders that own it."""
    env = {k: v for k, v in os.environ.items() if k != "AURALM_MODEL_PLUGINS"}
    out = subprocess.run([sys.executable, "-c", _OWNERS], cwd=REPO, env=env, capture_output=True, text=True,
                         check=True).stdout
    return {name: [(REPO / p).resolve() for p in paths] for name, paths in json.loads(out).items()}


def _constants(tree: ast.Module) -> dict[str, str]:
    """The module's own string constants (``DEFAULT_TASK = "sudoku"``): a name compared through one is compared."""
    out = {}
    for stmt in tree.body:
        targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target] if isinstance(stmt, ast.AnnAssign) \
            else []
        value = getattr(stmt, "value", None)
        if isinstance(value, ast.Constant) and isinstance(value.value, str):
            out.update((t.id, value.value) for t in targets if isinstance(t, ast.Name))
    return out


def _strings(node: ast.AST, constants: dict[str, str]) -> list[str]:
    """The strings a comparison's operand is: "ddp", a module constant holding one, or the members of ("ddp",
    "fsdp") / {...} / [...]."""
    items = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else [node]
    values = [n.value if isinstance(n, ast.Constant) else constants.get(n.id) if isinstance(n, ast.Name) else None
              for n in items]
    return [v for v in values if isinstance(v, str)]


def name_tests(path: Path, tree: ast.Module, owners: dict[str, list[Path]]) -> list[tuple[str, str, str]]:
    """(where, the comparison, the name) for each comparison in ``tree`` of a value with a registered name whose
    owners do not include ``path`` (relative to the repository)."""
    where, constants = (REPO / path).resolve(), _constants(tree)
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Compare):
            continue
        operands = (node.left, *node.comparators)
        for name in {s for operand in operands for s in _strings(operand, constants) if s in owners}:
            if not any(where == o or o in where.parents for o in owners[name]):
                found.append((f"{path}:{node.lineno}", ast.unparse(node), name))
    return found


def test_a_name_is_tested_only_by_its_owner():
    """No module of auralm/, cli/ or netcheck/ compares a value with a sync mode's, task's or family's name (``x ==
    "ddp"``, ``task in ("lm", ...)``) outside the name's own file or folder: it asks the registry, or the task, mode
    or family the name stands for, what it needs. NAMES_ALLOWED holds what must stay, each entry used."""
    owners = _owners()
    assert {"ddp", "diloco", "fsdp", "sudoku", "lm", "gpt", "hrm"} <= set(owners)
    found = [hit for room in ROOMS for path, tree in _modules(room) for hit in name_tests(path, tree, owners)]
    wrong = [f"{where}: {text} tests the name {name!r}" for where, text, name in found
             if (where.rpartition(":")[0], text) not in NAMES_ALLOWED]
    assert wrong == [], wrong
    used = {(where.rpartition(":")[0], text) for where, text, _ in found}
    assert NAMES_ALLOWED <= used, f"allowed but no longer there: {sorted(NAMES_ALLOWED - used)}"


def test_the_name_rule_sees_a_comparison_outside_the_owner_and_not_inside_it():
    owners = {"ddp": [(REPO / "auralm/parallel/ddp.py").resolve()], "lm": [(REPO / "auralm/tasks/lm").resolve()]}
    code = ast.parse("A = 'lm'\na = s['sync'] == 'ddp'\nb = task in ('x', 'lm')\nc = 'lm' != t\nd = s == 'ddpx'\n"
                     "e = t == A")
    assert [(t, n) for _, t, n in name_tests(Path("auralm/planning/x.py"), code, owners)] == [
        ("s['sync'] == 'ddp'", "ddp"), ("task in ('x', 'lm')", "lm"), ("'lm' != t", "lm"), ("t == A", "lm")]
    assert name_tests(Path("auralm/tasks/lm/__init__.py"), ast.parse("t == 'lm'"), owners) == []
    assert name_tests(Path("auralm/parallel/ddp.py"), ast.parse("s == 'ddp'"), owners) == []
