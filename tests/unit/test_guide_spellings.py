"""Issue #33, items 2, 5 and 10: a guide's line trains the family it names (or is refused in one line naming the family
a
key belongs to and the model= that selects it), the RLM guide's finetune.yaml keys act, and the guides' option
spellings (the HRM launcher's --learning_rate ...) are read as ours or refused with a correct "did you mean"."""

from __future__ import annotations

import json
import math
import os
import shlex
import subprocess
import sys

import pytest

from auralm.guides import spellings
from auralm.models import families
from auralm.training import command_line, config, optim, tracking
from auralm.errors import UserError

# The guides' lines as they are typed (the keys after the guide's own program name).
HRM_PRETRAIN = ("data_path=data/sudoku-extreme-1k-aug-1000 epochs=20000 eval_interval=2000 global_batch_size=384 "
                "lr=7e-5 puzzle_emb_lr=7e-5 weight_decay=1.0 puzzle_emb_weight_decay=1.0")  # the HRM guide's pretrain.py
HRM_SMALL = ("arch=hrm_v1 data_path=data/sudoku-extreme-small global_batch_size=4 lr=1e-4 arch.hidden_size=32 "
             "arch.H_layers=1 arch.L_layers=1 arch.num_heads=1 arch.expansion=2")  # issue #33, item 1
RLM_QUICK = "model.hidden_dim=256 model.num_layers=4 model.num_heads=4 model.mhc_flows=4"  # the RLM guide's quick start
RLM_BASIC = ("data.train_path=data/corpus.jsonl training.optimizer.lr=3e-4 training.batch_size=8 "
             "training.mixed_precision=bf16 training.max_steps=1000")  # the RLM guide's basic training line


@pytest.mark.parametrize("line, name, family, said", [
    (HRM_PRETRAIN, "hrm-27m", "hrm", "hrm-27m (HRM), chosen from puzzle_emb_lr=7e-5"),
    (HRM_SMALL, "hrm-27m", "hrm", "hrm-27m (HRM), chosen from arch=hrm_v1"),
    ("arch.H_layers=1 arch.L_layers=1 arch.H_cycles=2", "hrm-27m", "hrm", "hrm-27m (HRM), chosen from arch.H_layers=1"),
    ("arch.H_cycles=3 arch.mlp_t=true", "trm-7m", "trm", "trm-7m (TRM), chosen from arch.mlp_t=true"),
    (RLM_QUICK, "rlm-tiny", "rlm", "rlm-tiny (RLM), chosen from model.hidden_dim=256"),
    (RLM_BASIC, "rlm-tiny", "rlm", "rlm-tiny (RLM), chosen from data.train_path=data/corpus.jsonl"),
    ("model.ffn_dim=128", "rlm-tiny", "rlm", "rlm-tiny (RLM), chosen from model.ffn_dim=128"),
    ("model.mhc_flows=2", "rlm-tiny", "rlm", "rlm-tiny (RLM), chosen from model.mhc_flows=2"),
    ("model.H_layers=2", "hrm-tiny", "hrm", "hrm-tiny (HRM), chosen from model.H_layers=2"),
    ("model=50m task=lm", "hrm-50m", "hrm", "hrm-50m (HRM), chosen from model=50m"),
    ("model.H_cycles=3", "trm-tiny", "trm", ""),  # the default model has it: nothing chosen, nothing said
    ("model=hrm-tiny arch.H_layers=1", "hrm-tiny", "hrm", ""),
    ("task=sudoku training.optimizer.lr=1e-3", "trm-tiny", "trm", ""),  # a training key alone does not pick the RLM
    ("training.wandb.project=p", "trm-tiny", "trm", ""),  # nor does W&B
])
def test_a_guide_line_trains_the_family_it_names_and_says_so(line, name, family, said):
    cfg = command_line.parse(shlex.split(line))
    arch = config.resolved_model(cfg.model)
    assert (cfg.model.name, families.family(arch), cfg.model_choice) == (name, family, said)
    if family == "rlm":
        assert cfg.task == "lm"


def test_the_guides_keys_reach_the_chosen_model():
    arch = config.resolved_model(command_line.parse(shlex.split(HRM_SMALL)).model)
    assert (arch.n_embd, arch.H_layers, arch.L_layers, arch.n_head, arch.expansion) == (32, 1, 1, 1, 2)
    arch = config.resolved_model(command_line.parse(shlex.split(RLM_QUICK)).model)
    assert (arch.n_embd, arch.n_layer, arch.n_head, arch.mhc_flows) == (256, 4, 4, 4)
    cfg = command_line.parse(shlex.split(HRM_PRETRAIN))
    assert (cfg.training.puzzle_emb_lr, cfg.training.global_batch_size, cfg.data_dir) == \
        (7e-5, 384, "data/sudoku-extreme-1k-aug-1000")


@pytest.mark.parametrize("line, message", [
    ("model=trm-tiny arch.H_layers=2", "arch.H_layers (model.H_layers) is not a key of model=trm-tiny (TRM): it belongs "
                                       "to HRM; model=hrm-tiny (or arch=hrm_v1) selects it"),
    ("model=hrm-tiny arch.mlp_t=true", "arch.mlp_t (model.mlp_t) is not a key of model=hrm-tiny (HRM): it belongs to "
                                       "TRM; model=trm-tiny (or arch=trm) selects it"),
    ("model=tiny model.mhc_flows=2", "model.mhc_flows is not a key of model=tiny (GPT): it belongs to RLM; "
                                     "model=rlm-tiny selects it"),
    ("model=rlm-tiny arch.H_cycles=2", "arch.H_cycles (model.H_cycles) is not a key of model=rlm-tiny (RLM): it "
                                       "belongs to HRM and TRM; model=hrm-tiny (or arch=hrm_v1) or model=trm-tiny "
                                       "(or arch=trm) selects one"),
    ("model.n_layer=3", "model.n_layer is not a key of model=trm-tiny (TRM, the default model): it belongs to GPT and "
                        "RLM; model=tiny or model=rlm-tiny selects one"),
    ("model=hrm-tiny model.num_layers=4", "model.num_layers (model.n_layer) is not a key of model=hrm-tiny (HRM)"),
    ("arch.H_layers=1 model.ffn_dim=64", "model.ffn_dim is not a key of model=hrm-27m (HRM, chosen from "
                                         "arch.H_layers=1): it belongs to RLM; model=rlm-tiny selects it"),
])
def test_a_key_the_model_does_not_read_is_refused_naming_its_family(line, message):
    with pytest.raises(UserError) as e:
        command_line.parse(shlex.split(line))
    assert message in str(e.value) and "\n" not in str(e.value)


def test_every_family_reads_the_keys_of_its_sizes():
    keys = families.keys_of(config.SIZES)
    assert set(keys) == {"gpt", "hrm", "trm", "rlm"}
    assert "H_layers" in keys["hrm"] and "H_layers" not in keys["trm"]
    assert "mlp_t" in keys["trm"] and "mlp_t" not in keys["hrm"]
    assert {"ffn_dim", "mhc_flows", "n_layer"} <= keys["rlm"] and "n_layer" not in keys["hrm"] | keys["trm"]
    for name, size in config.SIZES.items():  # every size's own keys are accepted on it
        fam = families.family(size)
        overrides = [f"model={name}"] + (["task=lm"] if fam == "rlm" else [])
        for k in sorted(keys[fam] - {"vocab_size", "dropout"}):
            command_line.parse(overrides + [f"model.{k}={getattr(size, k)}"])


@pytest.mark.parametrize("override, meant", [
    ("learning_rate=1e-4", "did you mean 'training.lr'? --learning_rate is the HRM distributed launcher's spelling"),
    ("eval_steps=100", "did you mean 'training.eval_interval'? --eval_steps is the HRM distributed launcher's "
                       "spelling"),
    ("batch_size=8", "did you mean 'training.batch_size'?"),
    ("dry_run=true", "did you mean --dry-run?"),
    ("train_samples=1000", "--train_samples has no counterpart here: hrmctl trains on a prepared data directory"),
    ("training.max_step=5", "did you mean 'training.max_steps'?"),
    ("arch.hiden_size=64", "did you mean 'arch.hidden_size'? the HRM guide's pretrain.py's spelling of model.n_embd"),
])
def test_did_you_mean_names_the_key_the_guide_means(override, meant):
    with pytest.raises(UserError) as e:
        command_line.parse([override])
    assert meant in str(e.value), str(e.value)
    assert "ema_rate" not in str(e.value) and "guard.lr_steps" not in str(e.value)


def test_one_table_every_spelling_points_at_a_key_or_option_of_ours():
    import typer

    from cli.app import app
    from cli.launch.plan import guide_options
    from cli.tools.prepare_data import own_options

    keys = set(config.key_names())
    prepare = typer.main.get_command(app).commands["prepare-data"]
    options = {spellings.TRAIN: set(guide_options.FLAGS),
               spellings.PREPARE: set(own_options(prepare)) | {spellings.SOURCE}}
    for s in spellings.TABLE:
        ours = (keys if s.command == spellings.TRAIN else set()) | options[s.command]
        assert s.ours in ours or (not s.ours and s.note), s
        assert not s.accepted or (s.flag and not s.ours), s  # taken as it is: nothing to translate
    assert spellings.ALIASES["arch.hidden_size"] == "model.n_embd"
    assert not hasattr(config, "ALIASES")  # the config reads our keys only: the table is read before it
    assert config.resolved_model(command_line.parse(["arch.hidden_size=64", "arch.num_heads=2"]).model).n_embd == 64


FINETUNE_YAML = """\
# the RLM guide's finetune.yaml, with the keys it types
training:
  optimizer: {type: adamw, lr: 1.0e-3, weight_decay: 0.01, betas: [0.9, 0.999]}
  scheduler: {type: linear, warmup_steps: 2}
  wandb: {project: rlm-finetune, entity: aura-lab}
  max_steps: 6
"""


def test_the_finetune_yaml_types_act(tmp_path):
    f = tmp_path / "finetune.yaml"
    f.write_text(FINETUNE_YAML)
    cfg = command_line.parse(["model=rlm-tiny", f"config={f}"])
    t = cfg.training
    assert (t.optimizer, t.schedule, t.lr, t.warmup_steps, t.beta2) == ("adamw", "linear", 1e-3, 2, 0.999)
    assert (cfg.logging.wandb.project, cfg.logging.wandb.entity) == ("rlm-finetune", "aura-lab")
    # linear: a straight line from lr after the warmup down to lr * min_lr_ratio at max_steps
    expected = [5e-4, 1e-3, 7.75e-4, 5.5e-4, 3.25e-4, 1e-4]
    assert all(math.isclose(optim.lr_at(t, s), e) for s, e in zip(range(1, 7), expected))
    t.schedule = "constant"
    assert [optim.lr_at(t, s) for s in (3, 6)] == [1e-3, 1e-3]
    t.schedule = "cosine"
    assert math.isclose(optim.lr_at(t, 4), 1e-4 + 0.5 * (1 + math.cos(math.pi / 2)) * 0.9e-3)
    p = tracking.plan(cfg.logging)
    assert (p.wandb_project, p.wandb_entity) == ("rlm-finetune", "aura-lab")


@pytest.mark.parametrize("override, message", [
    ("training.optimizer.type=sgd", "training.optimizer.type='sgd': expected one of adam_atan2, adamatan2, adamw"),
    ("training.scheduler.type=polynomial", "training.scheduler.type='polynomial': expected one of constant, "
                                           "constant_with_warmup, cosine, cosine_with_min_lr, linear"),
    ("training.schedule=step", "training.schedule='step': expected one of cosine, linear, constant"),
])
def test_a_type_we_do_not_have_is_one_line(override, message):
    with pytest.raises(UserError) as e:
        command_line.parse(["model=rlm-tiny", "task=lm", override])
    assert message in str(e.value) and "\n" not in str(e.value)


# ---------------------------------------------------------------- hrmctl train: the launcher's options


def hrmctl(*args, cwd):
    return subprocess.run([sys.executable, "-m", "cli", *args], capture_output=True, text=True, timeout=120, cwd=cwd,
                          env={**os.environ, "HRMCTL_INVENTORY": str(cwd / "none.toml")})


@pytest.mark.slow  # seconds of real work (a training, hrmctl train, a compile): not in --fast (issue 35, item 6)
def test_the_launchers_options_are_read_as_ours(tmp_path):
    from tests.trainer.helpers import QUIJOTE, prepare_data

    corpus = tmp_path / "corpus.txt"
    corpus.write_text(QUIJOTE.read_text(encoding="utf-8-sig")[20000:60000], encoding="utf-8")
    assert prepare_data([str(corpus), "--out", str(tmp_path / "data" / "lm"), "--vocab-size", "300"]) == 0  # the preflight's
    res = hrmctl("train", "--model", "50m", "task=lm", "--batch_size", "2", "--learning_rate=3e-4", "--dry_run",
                 "--eval_steps", "50", "--run-id", "g1", "--json", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    [node] = doc["nodes"]
    argv = node["argv"]
    tail = argv[argv.index("auralm.training.train") + 1:]
    assert tail[:5] == ["model=50m", "task=lm", "training.batch_size=2", "training.lr=3e-4",
                        "training.eval_interval=50"], tail
    assert doc["model"]["name"] == "hrm-50m" and doc["model_choice"] == "hrm-50m (HRM), chosen from model=50m"
    assert res.stderr.splitlines()[0] == (
        "hrmctl: read as ours: --model 50m is model=50m (50m and 100m are hrm-50m and hrm-100m, language models: "
        "task=lm); --batch_size 2 is "
        "training.batch_size=2 (per rank and micro-step); --learning_rate 3e-4 is training.lr=3e-4; --dry_run is "
        "--dry-run; --eval_steps 50 is training.eval_interval=50 (evaluate every N steps)")


@pytest.mark.slow  # seconds of real work (hrmctl train --dry-run; torch processes): not in --fast (issue 35, item 6)
def test_the_dry_run_says_which_model_the_keys_chose(tmp_path):
    from tests.trainer.helpers import small_sudoku

    small_sudoku(tmp_path / "data" / "sudoku-extreme-small", count=60)  # the preflight looks for the guide's data
    res = hrmctl("train", "--dry-run", *shlex.split(HRM_SMALL), cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert "# model: hrm-27m (HRM), chosen from arch=hrm_v1" in res.stdout.splitlines()


@pytest.mark.parametrize("args, line", [
    (["--train_samples", "1000"], "error: unknown option --train_samples (the HRM distributed launcher's "
                                  "--train_samples has no counterpart here: hrmctl trains on a prepared data "
                                  "directory: cap its size with `hrmctl prepare-data SOURCE --max-tokens N`"),
    (["--learing_rate", "1e-4"], "error: unknown option --learing_rate (did you mean --learning_rate? the HRM "
                                 "distributed launcher's spelling of training.lr)"),
    (["--dry-runn"], "error: unknown option --dry-runn (did you mean --dry-run?)"),
    (["--max_step", "5"], "error: unknown option --max_step (did you mean --max_steps? the HRM distributed "
                          "launcher's spelling of training.max_steps)"),
    (["--node_rank", "1"], "error: unknown option --node_rank (torchrun's --node_rank has no counterpart here: "
                           "hrmctl sets it on every node from --nodes"),
    (["--learning_rate"], "error: --learning_rate needs a value (the HRM distributed launcher's spelling of "
                          "training.lr)"),
    (["learning_rate=1e-4"], "error: trainer overrides rejected: unknown key 'learning_rate' (did you mean "
                             "'training.lr'?"),
    (["model=trm-tiny", "arch.H_layers=2"], "error: trainer overrides rejected: arch.H_layers (model.H_layers) is "
                                            "not a key of model=trm-tiny (TRM): it belongs to HRM"),
])
def test_a_spelling_we_do_not_take_is_one_line_with_the_right_pointer(tmp_path, args, line):
    res = hrmctl("train", "--dry-run", *args, cwd=tmp_path)
    assert res.returncode == 2 and res.stdout == ""
    assert res.stderr.startswith(line) and res.stderr.count("\n") == 1 and "Traceback" not in res.stderr


def test_the_docs_page_lists_every_spelling_of_the_table():
    from pathlib import Path

    page = (Path(__file__).resolve().parents[2] / "docs" / "guides.md").read_text()
    missing = [s.theirs for s in spellings.TABLE if f"`{s.theirs}`" not in page]
    assert not missing, missing
    for line in (HRM_PRETRAIN, HRM_SMALL, RLM_BASIC):  # the guides' lines as the page shows them
        assert line in page


def test_the_hrm_guides_line_trains_hrm_and_the_run_says_so(tmp_path, capsys, one_thread):
    """The small HRM line of issue #33 through the trainer (two steps; fp32, item 1 being the bf16 default's): the
    run's log says which model the keys chose, and its saved config is HRM's with the guide's shape."""
    from auralm.training import train
    from tests.trainer.helpers import small_sudoku

    data_dir = small_sudoku(tmp_path / "sudoku-extreme-small", count=60)
    line = shlex.split(HRM_SMALL.replace("data/sudoku-extreme-small", str(data_dir)))
    run = tmp_path / "run"
    assert train.main([*line, "training.max_steps=2", "training.dtype=fp32", "training.eval_interval=0",
                       "training.checkpoint_interval=0", "training.log_interval=1", f"out_dir={run}"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert "model: hrm-27m (HRM), chosen from arch=hrm_v1" in out
    assert any(line.startswith("model hrm-27m (hrm): ") for line in out), out
    saved = json.loads((run / "config.json").read_text())
    assert (saved["model"]["family"], saved["model"]["n_embd"], saved["model"]["H_layers"]) == ("hrm", 32, 1)
    assert saved["model_choice"] == "hrm-27m (HRM), chosen from arch=hrm_v1"


def test_test_ddp_points_a_guides_option_at_our_key(tmp_path):
    res = hrmctl("test-ddp", "--dry-run", "model=tiny", "--learning_rate", "1", cwd=tmp_path)
    assert (res.returncode, res.stdout) == (2, "")
    assert res.stderr == ("error: unknown option --learning_rate (did you mean the override training.lr=VALUE? "
                          "--learning_rate is the HRM distributed launcher's spelling)\n")
    res = hrmctl("test-ddp", "--dry-run", "--secnds", "1", cwd=tmp_path)
    assert res.returncode == 2 and res.stderr == "error: unknown option --secnds (did you mean --seconds?)\n"


# ---------------------------------------------------------------- issue 63, item 6: the guides' lines that still failed

def read(*args: str):
    from cli.launch.plan import guide_options

    return guide_options.read(list(args), "trainer overrides are key=value", ["--nproc", "--nodes", "--dry-run"])


@pytest.mark.parametrize("args, overrides, options, said", [
    (["--batch-size", "8", "model=tiny"], ["training.batch_size=8", "model=tiny", "task=lm"], {},
     "--batch-size 8 is training.batch_size=8 (per rank and micro-step)"),
    (["--seq-len=256", "task=lm"], ["model.block_size=256", "task=lm", "model=124m"], {},
     "--seq-len 256 is model.block_size=256 (the model's context, in tokens)"),
    (["--gpus", "2"], [], {"nproc": 2, "gpus": 2}, "--gpus 2 is --nproc 2 (one process per GPU: refused where a node "
                                                   "has fewer GPUs)"),
    (["--verbose"], [], {}, "--verbose is accepted (hrmctl's log shows every rank's lines already, each node's whole "
                            "output is in runs/<run-id>/<node>.log, and training.log_interval=N logs every N steps)"),
    (["--distributed", "model=hrm-tiny", "task=sudoku"], ["model=hrm-tiny", "task=sudoku"], {"distributed": True},
     None),  # said with the nodes it stands for (across_machines)
    (["--model", "100m"], ["model=100m"], {}, "--model 100m is model=100m (50m and 100m are hrm-50m and hrm-100m, "
                                              "language models: task=lm)"),
    (["--max-steps", "3"], ["training.max_steps=3"], {}, "--max-steps 3 is training.max_steps=3"),  # other dashes
    (["--Learning-Rate=1e-3"], ["training.lr=1e-3"], {}, "--Learning-Rate 1e-3 is training.lr=1e-3"),
])
def test_each_guide_option_is_read_as_ours_and_said(args, overrides, options, said):
    r = read(*args)
    assert (r.args, r.options) == (overrides, options)
    assert r.said[:1] == ([said] if said else [])


def test_auralms_options_mean_its_gpt_on_text_where_the_line_does_not_say():
    r = read("--batch-size", "8", "--seq-len", "256")
    assert r.args == ["training.batch_size=8", "model.block_size=256", "model=124m", "task=lm"]
    assert r.said[-1] == "model=124m task=lm (AuraLM's train_gpt2_spanish.py's model on text, where the line does " \
                         "not say)"
    cfg = command_line.parse(r.args)
    assert (cfg.task, cfg.model.name, cfg.model.given["block_size"]) == ("lm", "124m", 256)
    assert read("--batch-size", "8", "arch=hrm_v1", "task=sudoku").args[-2:] == ["arch=hrm_v1", "task=sudoku"]


@pytest.mark.parametrize("args, line", [
    (["--prepare", "--dataset-name", "wikipedia", "--dataset-max-tokens", "500000", "--batch-size", "8"],
     "--prepare --dataset-name wikipedia --dataset-max-tokens 500000 (AuraLM's train_gpt2_spanish.py) prepare data, "
     "which hrmctl does in a step of its own: run `hrmctl prepare-data wikipedia --max-tokens 500000 --out data/lm` "
     "first, then this line without them"),
    (["--prepare"], "--prepare (AuraLM's train_gpt2_spanish.py) prepares data, which hrmctl does in a step of its own: "
                    "run `hrmctl prepare-data corpus.txt --out data/lm` first, then this line without it"),
    (["--dataset-name=es.txt", "data_dir=data/es"], "--dataset-name es.txt (AuraLM's train_gpt2_spanish.py) prepares "
                                                    "data, which hrmctl does in a step of its own: run `hrmctl "
                                                    "prepare-data es.txt --out data/es` first, then this line without "
                                                    "it"),
    (["--verbose=1"], "--verbose takes no value (the HRM distributed launcher's --verbose: hrmctl's log"),
    (["--gpus"], "--gpus needs a value (the HRM distributed launcher's spelling of --nproc)"),
    (["--gpus", "two"], "--gpus two: expected an integer (--nproc)"),
    (["train_gpt2_spanish.py", "--batch-size", "8"], "train_gpt2_spanish.py is a guide's script: hrmctl train runs its "
                                                     "own trainer (auralm.training.train) and reads the guide's "
                                                     "options after it as ours; drop train_gpt2_spanish.py"),
])
def test_a_guide_option_refused_on_train_is_one_line_naming_the_fix(args, line, tmp_path, monkeypatch):
    from cli.errors import HrmctlError

    monkeypatch.chdir(tmp_path)
    with pytest.raises(HrmctlError) as e:
        read(*args)
    assert str(e.value).startswith(line) and "\n" not in str(e.value), str(e.value)


def test_prepare_on_train_when_the_data_is_there_says_to_drop_it(tmp_path, monkeypatch):
    from cli.errors import HrmctlError

    monkeypatch.chdir(tmp_path)
    (tmp_path / "data" / "lm").mkdir(parents=True)
    (tmp_path / "data" / "lm" / "meta.json").write_text("{}")
    with pytest.raises(HrmctlError) as e:
        read("--prepare", "--dataset-name", "wikipedia")
    assert str(e.value).endswith("and data/lm is prepared already: drop them from this line (`hrmctl prepare-data "
                                 "wikipedia --out data/lm` prepares it again)")


def launch_options(tmp_path, toml: str | None, nodes: str | None = None):
    from cli.launch.plan.options import launch_options as make

    inv = tmp_path / "hrmctl.toml"
    if toml is not None:
        inv.write_text(toml)
    return make(inventory=str(inv) if toml is not None else None, nodes=nodes, env=None, reprobe=False)


TWO_LAPTOPS = '[nodes.laptop1]\nhost = "192.168.1.21"\n[nodes.laptop2]\nhost = "192.168.1.22"\n'


def test_distributed_is_every_node_of_the_inventory_or_the_nodes_given(tmp_path, monkeypatch):
    from cli.errors import HrmctlError
    from cli.launch.plan.guide_options import across_machines

    opts = launch_options(tmp_path, TWO_LAPTOPS)
    assert across_machines(opts) == f"--distributed is --nodes laptop1,laptop2 (every node of {tmp_path / 'hrmctl.toml'})"
    assert [n.name for n in opts.nodes] == ["laptop1", "laptop2"]
    opts = launch_options(tmp_path, TWO_LAPTOPS, nodes="laptop2,laptop1")
    assert across_machines(opts) == "--distributed is the run across --nodes laptop2,laptop1"
    monkeypatch.delenv("HRMCTL_INVENTORY", raising=False)
    (tmp_path / "hrmctl.toml").unlink()
    monkeypatch.chdir(tmp_path)  # no hrmctl.toml here
    with pytest.raises(HrmctlError) as e:
        across_machines(launch_options(tmp_path, None))
    assert str(e.value) == ("--distributed (AuraLM's train_gpt2_spanish.py's run across machines): there is no "
                            "inventory (hrmctl.toml); name the machines with --nodes node0,node1 (`hrmctl init --hosts "
                            "HOST0,HOST1` writes hrmctl.toml with them), or drop --distributed to train on this machine "
                            "alone")


@pytest.mark.parametrize("gpus, have, line", [
    (2, 0, "localhost: --gpus 2 is a process on each of 2 GPUs, and localhost has no GPU that torch can use; fix: "
           "--nproc 2 for 2 processes on its CPU, or drop --gpus (hrmctl runs a process per GPU, else one)"),
    (2, 1, "localhost: --gpus 2 is a process on each of 2 GPUs, and localhost has 1 GPU(s) that torch can use; fix: "
           "--gpus 1, or drop --gpus"),
    (2, 2, None),
])
def test_gpus_is_refused_before_launch_where_a_node_has_fewer(gpus, have, line):
    from cli.errors import HrmctlError
    from cli.launch.plan.plan import NodeFacts
    from cli.launch.preflight.prepare import _check_nproc
    from cli.nodes.inventory import local_node

    facts = {"localhost": NodeFacts(cpus=4, gpus=have, nccl=bool(have))}
    if line is None:
        _check_nproc([local_node()], facts, gpus, gpus)
        return
    with pytest.raises(HrmctlError) as e:
        _check_nproc([local_node()], facts, gpus, gpus)
    assert str(e.value).startswith(line), str(e.value)


@pytest.mark.parametrize("line, task", [
    ("model=50m", "lm"), ("model=100m", "lm"), ("model=hrm-50m", "lm"), ("model=50m task=sudoku", "sudoku"),
    ("model=hrm-27m", "sudoku"), ("model=hrm-tiny", "sudoku"), ("", "sudoku"),
])
def test_the_launchers_models_are_language_models_unless_task_says(line, task):
    assert command_line.parse(line.split()).task == task


def test_wandb_keys_are_refused_before_launch_where_rank_0s_node_lacks_the_package():
    from types import SimpleNamespace

    from cli.errors import HrmctlError
    from cli.launch.preflight.prepare import _check_packages
    from cli.nodes.inventory import local_node
    from node import probe as node_probe

    def probe(**versions):
        return SimpleNamespace(raw={"project": {"versions": versions}})

    from auralm.training.command_line import parse

    args = parse(["logging.wandb.project=aura", "logging.wandb.mode=offline"])
    master = local_node()
    with pytest.raises(HrmctlError) as e:
        _check_packages(args, master, probe(wandb=None, torch="2.13.0"))
    assert str(e.value) == (f"localhost: logging.wandb.project needs the wandb package, not installed for "
                            f"{master.python} there (rank 0 logs from localhost); fix: on localhost `{master.python} -m "
                            f"pip install wandb`, or drop logging.wandb.project")
    _check_packages(args, master, probe(wandb="0.19.0"))  # installed
    _check_packages(args, master, probe(torch="2.13.0"))  # a probe that did not look: the trainer's own check
    _check_packages(parse(["model=tiny"]), master, probe(wandb=None))  # not asked for
    _check_packages(None, master, probe(wandb=None))  # overrides the trainer refuses: its own check says why
    assert {"wandb", "tensorboard"} <= set(node_probe.project_facts(None)["versions"])  # the probe looks


@pytest.mark.slow  # hrmctl train's preflight (a probe, the trainer's check): seconds of torch processes
def test_the_launchers_model_alone_without_text_is_refused_before_launch_naming_prepare_data(tmp_path):
    res = hrmctl("train", "--model", "50m", "--dry-run", cwd=tmp_path)
    assert res.returncode == 1 and res.stdout == "", res
    said, refused = res.stderr.splitlines()
    assert said == "hrmctl: read as ours: --model 50m is model=50m (50m and 100m are hrm-50m and hrm-100m, language " \
                   "models: task=lm)"
    assert refused.startswith(f"error: localhost: {tmp_path}/data/lm holds no prepared data (no such directory, or "
                              "empty); fix: `hrmctl prepare-data corpus.txt --out data/lm`; task=lm trains on text"), \
        refused
    assert "allenai/c4 --config en --streaming --max-tokens 100000000" in refused
