"""The papers' recipes (auralm/training/recipes.py): recipe=NAME sets every hyper-parameter of the public
pretrain.py configs under the command line's keys, a pasted pretrain.py line implies its recipe, the puzzle embedding
is stepped by sign-SGD with its own rate and decay, and TRM's 16 puzzle-embedding positions hold the embedding then
zeros."""

from __future__ import annotations

import sys

import pytest
import torch

from auralm import models
from auralm.errors import UserError
from auralm.training import command_line, config, optim

# the READMEs' lines as they are typed after `python pretrain.py`
TRM_MLP = ("arch=trm data_paths=[data/sudoku-extreme-1k-aug-1000] evaluators=[] epochs=50000 eval_interval=5000 "
           "lr=1e-4 puzzle_emb_lr=1e-4 weight_decay=1.0 puzzle_emb_weight_decay=1.0 arch.mlp_t=True "
           "arch.pos_encodings=none arch.L_layers=2 arch.H_cycles=3 arch.L_cycles=6 +run_name=mlp ema=True")
TRM_ATT = TRM_MLP.replace(" arch.mlp_t=True arch.pos_encodings=none", "")
HRM = ("data_path=data/sudoku-extreme-1k-aug-1000 epochs=20000 eval_interval=2000 global_batch_size=384 lr=7e-5 "
       "puzzle_emb_lr=7e-5 weight_decay=1.0 puzzle_emb_weight_decay=1.0")
# the READMEs' Maze-Hard lines
TRM_MAZE = ("arch=trm data_paths=[data/maze-30x30-hard-1k] evaluators=[] epochs=50000 eval_interval=5000 lr=1e-4 "
            "puzzle_emb_lr=1e-4 weight_decay=1.0 puzzle_emb_weight_decay=1.0 arch.L_layers=2 arch.H_cycles=3 "
            "arch.L_cycles=4 +run_name=maze ema=True")
HRM_MAZE = ("data_path=data/maze-30x30-hard-1k epochs=20000 eval_interval=2000 lr=1e-4 puzzle_emb_lr=1e-4 "
            "weight_decay=1.0 puzzle_emb_weight_decay=1.0")


def _common(t: config.TrainingConfig) -> None:
    """cfg_pretrain.yaml's training, as both repositories have it."""
    assert (t.optimizer, t.beta1, t.beta2, t.warmup_steps, t.min_lr_ratio, t.grad_clip) == \
        ("adam_atan2_if_installed", 0.9, 0.95, 2000, 1.0, 0)
    assert t.puzzle_emb_optimizer == "sign_sgd" and t.augment is False


@pytest.mark.parametrize("line, recipe, model, mlp, ema, batch", [
    (TRM_MLP, "trm-sudoku-mlp", "trm-7m", True, True, 768),
    (TRM_ATT, "trm-sudoku-att", "trm-7m", False, True, 768),
    (HRM, "hrm-sudoku", "hrm-27m", False, False, 384),
])
def test_a_pasted_pretrain_line_follows_its_papers_recipe_and_says_so(line, recipe, model, mlp, ema, batch):
    cfg = command_line.parse(line.split())
    t, arch = cfg.training, config.resolved_model(cfg.model)
    _common(t)
    assert cfg.recipe == recipe and cfg.model.name == model and getattr(arch, "mlp_t", False) == mlp and t.ema == ema
    assert t.global_batch_size == batch and (t.weight_decay, t.puzzle_emb_weight_decay) == (1.0, 1.0)
    assert t.epochs == float(line.split("epochs=")[1].split()[0])  # the line's own length
    assert arch.puzzle_emb_len == (16 if recipe.startswith("trm") else 0)
    assert cfg.recipe_note.startswith(f"recipe {recipe}: ") and "(a pretrain.py line; recipe=none keeps hrmctl's " \
        "defaults)" in cfg.recipe_note and "training.warmup_steps=2000" in cfg.recipe_note


@pytest.mark.parametrize("line, recipe, model, ema", [(TRM_MAZE, "trm-maze", "trm-7m", True),
                                                    (HRM_MAZE, "hrm-maze", "hrm-27m", False)])
def test_a_pasted_maze_line_trains_the_maze_task_under_its_papers_recipe(line, recipe, model, ema):
    cfg = command_line.parse(line.split())
    t, arch = cfg.training, config.resolved_model(cfg.model)
    assert (cfg.recipe, cfg.task, cfg.model.name, t.ema) == (recipe, "maze", model, ema)
    assert cfg.data_dir == "data/maze-30x30-hard-1k" and t.global_batch_size == 768 and t.augment is True
    assert (t.optimizer, t.warmup_steps, t.grad_clip, t.lr, t.puzzle_emb_lr) == \
        ("adam_atan2_if_installed", 2000, 0, 1e-4, 1e-4)
    assert (t.weight_decay, t.puzzle_emb_weight_decay, t.puzzle_emb_optimizer) == (1.0, 1.0, "sign_sgd")
    if recipe == "trm-maze":
        assert (arch.L_cycles, arch.H_cycles, arch.L_layers, arch.puzzle_emb_len) == (4, 3, 2, 16)
    assert "task=maze" in cfg.recipe_note
    named = command_line.parse([f"recipe={recipe}"])  # by name: the same settings, the README's length
    assert (named.task, named.model.name, named.training.epochs) == ("maze", model, t.epochs)


def test_recipe_by_name_sets_the_readmes_length_and_the_command_line_wins():
    cfg = command_line.parse(["recipe=trm-sudoku-mlp", "training.lr=3e-4", "model.L_cycles=4"])
    t, arch = cfg.training, config.resolved_model(cfg.model)
    _common(t)
    assert cfg.model.name == "trm-5m-mlp" and arch.mlp_t and arch.pos_encodings == "none"
    assert (t.lr, t.puzzle_emb_lr, arch.L_cycles, arch.H_cycles) == (3e-4, 1e-4, 4, 3)
    assert (t.epochs, t.eval_every_epochs, t.ema, t.ema_decay) == (50000, 5000, True, 0.999)
    assert cfg.model_choice == "trm-5m-mlp (TRM), chosen from recipe=trm-sudoku-mlp"


def test_no_recipe_keeps_our_defaults_and_a_bad_one_is_one_line():
    for line in ([], ["model=trm-tiny"], ["model=trm-tiny", "puzzle_emb_lr=1e-3"], ["arch=trm", "recipe=none"]):
        cfg = command_line.parse(line)
        assert cfg.recipe == "" and cfg.recipe_note == "" and cfg.training.warmup_steps == 30, line
        assert cfg.training.optimizer == "adamw" and cfg.training.grad_clip == 1.0
    with pytest.raises(UserError, match=r"^recipe=trm-sudoku: expected one of hrm-sudoku, trm-sudoku-mlp, "
                                        r"trm-sudoku-att, hrm-maze, trm-maze \(or none: hrmctl's own defaults\)$"):
        command_line.parse(["recipe=trm-sudoku"])


def test_the_schedule_warms_up_over_2000_steps_then_stays_constant():
    t = command_line.parse(["recipe=trm-sudoku-att", "training.max_steps=10000"]).training
    assert optim.lr_at(t, 1000) == pytest.approx(0.5e-4)
    assert optim.lr_at(t, 2000) == optim.lr_at(t, 5000) == optim.lr_at(t, 10000) == pytest.approx(1e-4)


def _small(*extra: str) -> tuple[config.Config, torch.nn.Module]:
    cfg = command_line.parse(["recipe=trm-sudoku-att", "model.n_embd=32", "model.n_head=2", "model.puzzle_emb_ndim=32",
                        "model.H_cycles=1", "model.L_cycles=1", *extra])
    torch.manual_seed(0)
    return cfg, models.build("sudoku", config.resolved_model(cfg.model), None)


def test_the_puzzle_embedding_takes_a_sign_sgd_step_and_the_rest_the_optimizers_own():
    cfg, model = _small("training.optimizer=adamw")
    t = cfg.training
    twin = models.build("sudoku", config.resolved_model(cfg.model), None)
    twin.load_state_dict(model.state_dict())
    signed = optim.make_optimizer(model, t, torch.device("cpu"))
    plain = optim.make_optimizer(twin, command_line.parse(["training.optimizer=adamw", "training.weight_decay=1.0",
                                                     "training.beta2=0.95", "training.decay_vectors=true"]).training,
                                 torch.device("cpu"))
    for opt in (signed, plain):
        optim.set_lr(opt, 1e-3)
    emb = model.core.puzzle_emb.weight
    with torch.no_grad():
        emb.normal_()
        twin.core.puzzle_emb.weight.copy_(emb)
    before = emb.detach().clone()
    g = torch.Generator().manual_seed(1)
    for m in (model, twin):
        for p in m.parameters():
            p.grad = torch.randn(p.shape, generator=g.manual_seed(p.numel()))
    grad = emb.grad.clone()
    signed.step()
    plain.step()
    lr = 1e-3 * t.puzzle_emb_lr / t.lr
    torch.testing.assert_close(emb.detach(), before * (1 - lr * t.puzzle_emb_weight_decay) - lr * grad.sign())
    for (name, a), b in zip(model.named_parameters(), twin.parameters()):
        if "puzzle_emb" not in name:  # AdamW's step, as a plain AdamW takes it
            torch.testing.assert_close(a, b, msg=name)
    state = signed.state_dict()  # one optimizer: one state, its groups marked
    assert [g.get("sign_sgd") for g in state["param_groups"]] == [None, None, True]


def test_trms_16_positions_hold_the_embedding_then_zeros_with_the_same_parameters():
    cfg, model = _small()
    _, without = _small("model.puzzle_emb_len=0")
    assert model.core.n_prefix == 16 and without.core.n_prefix == 1
    assert sum(p.numel() for p in model.parameters()) == sum(p.numel() for p in without.parameters())
    with torch.no_grad():
        model.core.puzzle_emb.weight.fill_(1.0)
        e = model.core.embed_inputs(torch.zeros(2, 81, dtype=torch.long))
    assert e.shape == (2, 97, 32)
    scale = model.core.embed_scale
    assert torch.equal(e[:, 0], torch.full((2, 32), scale)) and not e[:, 1:16].any()  # the scratch positions
    x = torch.randint(0, 10, (2, 81))
    preds, qs, logits = model.solve(x, 2)
    assert logits.shape[-2] == 81
    with pytest.raises(UserError, match="model.puzzle_emb_len=16: the puzzle embedding's positions need "
                                        "model.puzzle_emb_ndim > 0"):
        command_line.parse(["model=trm-tiny", "model.puzzle_emb_len=16"])


def test_where_adam_atan2_is_missing_the_recipe_falls_back_to_adamw_and_says_so(monkeypatch, capsys):
    cfg, model = _small()
    monkeypatch.setitem(sys.modules, "adam_atan2_pytorch", None)  # import fails as if not installed
    opt = optim.make_optimizer(model, cfg.training, torch.device("cpu"))
    assert isinstance(opt, torch.optim.AdamW)
    assert "optimizer: AdamW (the recipe's AdamATan2 needs the package adam-atan2-pytorch" in capsys.readouterr().err
    with pytest.raises(UserError, match="training.optimizer=adam_atan2 needs the package adam-atan2-pytorch"):
        optim.make_optimizer(model, command_line.parse(["training.optimizer=adam_atan2"]).training, torch.device("cpu"))


def test_a_pasted_lines_data_tells_its_task_by_its_manifest_else_by_the_preset_it_is_named_after(tmp_path):
    from auralm.guides import implied

    mine = tmp_path / "my-mazes"
    mine.mkdir()
    (mine / "meta.json").write_text('{"task": "maze"}')
    assert implied.data_task(str(mine)) == "maze"  # its manifest, whatever its name
    assert implied.data_task("data/maze-30x30-hard-1k") == "maze"  # not here: the preset it is named after
    assert implied.data_task("data/sudoku-extreme-1k-aug-1000") == "sudoku"
    assert implied.data_task(str(tmp_path / "elsewhere")) == "sudoku"  # pretrain.py's own
    for line in (["arch=trm", f"data_paths=[{mine}]"], ["arch=trm", f"data_path={mine}"], ["arch=trm", f"data_dir={mine}"]):
        cfg = command_line.parse(line)
        assert (cfg.recipe, cfg.task) == ("trm-maze", "maze"), line


@pytest.mark.parametrize("recipe, task, classes", [("trm-sudoku-att", "sudoku", 9), ("hrm-sudoku", "sudoku", 9),
                                                   ("trm-maze", "maze", 5)])
def test_the_recipes_heads_have_the_public_codes_never_target_classes_and_decay_every_parameter(recipe, task, classes):
    """Their heads have a class for each value of their vocabulary: PAD and blank besides sudoku's 9 digits, PAD
    besides a maze's 5 characters (model.extra_classes), and their optimizer decays every parameter, vectors too
    (training.decay_vectors). Our own defaults keep the task's classes and decay matrices only."""
    small = ["model.n_embd=32", "model.n_head=2", "model.puzzle_emb_ndim=32", "model.H_cycles=1", "model.L_cycles=1"]
    cfg = command_line.parse([f"recipe={recipe}", *small])
    extra = 2 if task == "sudoku" else 1
    arch = config.resolved_model(cfg.model)
    assert arch.extra_classes == extra and cfg.training.decay_vectors
    model = models.build(task, arch, None)
    assert model.core.head.weight.shape[0] == classes + extra
    groups = optim.make_optimizer(model, cfg.training, torch.device("cpu")).param_groups
    assert all(g["weight_decay"] == 1.0 for g in groups), [g["weight_decay"] for g in groups]
    plain = command_line.parse([f"task={task}", "model=trm-tiny"])
    assert config.resolved_model(plain.model).extra_classes == 0 and not plain.training.decay_vectors
    built = models.build(task, config.resolved_model(plain.model), None)
    assert built.core.head.weight.shape[0] == classes
    assert [g["weight_decay"] for g in optim.make_optimizer(built, plain.training, torch.device("cpu")).param_groups] \
        == [plain.training.weight_decay, 0.0]


def test_extra_classes_are_never_a_digit_of_a_solved_grid_and_not_a_key_of_a_gpt():
    """A prediction of a class past the digits (the extra ones no target has) is no digit: the solved grid has 0
    there and is not a solution; model.extra_classes is the recurrent families' key only, and not negative."""
    from auralm.tools.solve import is_solution, solve

    class Fixed(torch.nn.Module):  # a recurrent model whose last segment predicts these classes
        recurrent = True

        def solve(self, x, segments=None):
            preds = torch.zeros_like(x)
            preds[:, 0], preds[:, 1] = 9, 10
            return preds.unsqueeze(0), None, None

    puzzle = [0] * 81
    [grid] = solve(Fixed(), [puzzle])
    assert grid[:3] == [0, 0, 1] and not is_solution(grid, puzzle)
    with pytest.raises(UserError, match="extra_classes"):
        command_line.parse(["task=lm", "model=tiny", "model.extra_classes=2"])
    with pytest.raises(UserError, match="extra_classes"):
        command_line.parse(["model=trm-tiny", "model.extra_classes=-1"])
