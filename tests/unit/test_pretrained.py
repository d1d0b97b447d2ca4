"""save_pretrained / from_pretrained on every family, and config.yaml in the checkpoints of a real short run."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
import yaml

from auralm.tools import inference
from auralm.training import checkpoint, config, train
from auralm.data.datadir import sha256_file
from auralm.errors import UserError
from auralm.models import ACT, GPT, Pretrained, RLMModel, SudokuNet, build

VOCAB = 300
RLM_SMALL = ["model.n_embd=64", "model.head_dim=16", "model.ffn_dim=96", "model.n_layer=2", "model.block_size=32"]


pytestmark = pytest.mark.usefixtures("one_thread")


def outputs(model, task: str) -> list[torch.Tensor]:
    """The model's outputs in eval mode on a fixed input (for ACT: one segment from the initial carry)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 10, (2, 81), generator=g) if task == "sudoku" else torch.randint(0, VOCAB, (2, 16), generator=g)
    with torch.no_grad():
        if isinstance(model, ACT):
            y = torch.randint(0, 9, x.shape, generator=g) if task == "sudoku" else x
            _, logits, q, _ = model(model.initial_carry(x, y), x, y)
            return [logits, q]
        return [model(x)[0]]


@pytest.mark.parametrize("name, task, overrides, cls", [
    ("tiny", "lm", [], GPT),
    ("tiny", "sudoku", [], SudokuNet),
    ("hrm-tiny", "sudoku", ["model.n_embd=32"], ACT),
    ("trm-tiny", "sudoku", ["model.n_embd=32"], ACT),
    ("rlm-tiny", "lm", RLM_SMALL, RLMModel),
])
def test_every_family_saves_and_loads_back_the_same_model(tmp_path, name, task, overrides, cls):
    cfg = config.parse([f"task={task}", f"model={name}", *overrides])
    model = build(task, config.resolved_model(cfg.model), VOCAB if task == "lm" else None).eval()
    assert isinstance(model, cls) and isinstance(model, Pretrained)
    assert model.save_pretrained(tmp_path / "out") == tmp_path / "out"
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["checksums.json", "config.yaml", "model.safetensors"]
    saved = yaml.safe_load((tmp_path / "out" / "config.yaml").read_text())
    assert saved["task"] == task and saved["family"] == model.config["family"] and saved["model"]["n_embd"] > 0
    loaded = cls.from_pretrained(tmp_path / "out")
    assert type(loaded) is type(model) and not loaded.training
    assert all(torch.equal(a, b) for a, b in zip(outputs(model, task), outputs(loaded, task)))
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), loaded.state_dict().values()))
    again = Pretrained.from_pretrained(tmp_path / "out")  # the mixin itself: any family
    assert type(again) is type(model)
    loaded.save_pretrained(tmp_path / "out")  # saving over an earlier save replaces it whole
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]
    assert all(torch.equal(a, b) for a, b in zip(outputs(model, task), outputs(cls.from_pretrained(tmp_path / "out"), task)))


@pytest.fixture(scope="module")
def run(tmp_path_factory, quijote_data):
    """A real short RLM run on the Spanish text, with EMA: its checkpoint-3."""
    base = tmp_path_factory.mktemp("rlm")
    lm = quijote_data(VOCAB, 20000)
    torch.set_num_threads(1)
    assert train.main(["task=lm", f"data_dir={lm}", f"out_dir={base / 'run'}", "model=rlm-tiny", *RLM_SMALL,
                       "training.batch_size=4", "training.max_steps=3", "training.warmup_steps=1",
                       "training.eval_interval=0", "training.ema=true"]) == 0
    return base / "run"


def test_a_checkpoint_holds_its_config_as_yaml_covered_by_the_checksums(run):
    ckpt = run / "checkpoint-3"
    state = json.loads((ckpt / "state.json").read_text())
    saved = yaml.safe_load((ckpt / "config.yaml").read_text())
    assert saved == dict(state["config"], vocab_size=state["vocab_size"])
    assert list(saved)[:2] == ["task", "data_dir"] and saved["model"]["name"] == "rlm-tiny"  # the config's order
    sums = json.loads((ckpt / "checksums.json").read_text())
    assert sums["config.yaml"] == sha256_file(ckpt / "config.yaml") and checkpoint.problem(ckpt) is None


def test_from_pretrained_loads_a_checkpoint_or_a_run_with_its_ema_weights_and_saves_it_again(run, tmp_path):
    ckpt = run / "checkpoint-3"
    model = RLMModel.from_pretrained(ckpt)
    assert isinstance(model, RLMModel) and not model.training and model.arch.n_embd == 64
    ema = torch.load(ckpt / "ema.pt", weights_only=True)
    params = dict(model.named_parameters())
    assert ema and all(torch.equal(params[n], v) for n, v in ema.items())  # the EMA weights, as hrmctl eval uses
    raw = RLMModel.from_pretrained(run, use_ema=False)  # the run directory: its newest checkpoint
    assert not all(torch.equal(dict(raw.named_parameters())[n], v) for n, v in ema.items())
    model.save_pretrained(f"{tmp_path}/out/")  # plain strings, as in the usage
    again = RLMModel.from_pretrained(f"{tmp_path}/out/")
    assert torch.equal(outputs(model, "lm")[0], outputs(again, "lm")[0])
    assert torch.equal(outputs(model, "lm")[0], outputs(RLMModel.from_pretrained(run), "lm")[0])
    loaded = inference.load(tmp_path / "out")  # hrmctl eval's loader is the same path
    assert loaded.task == "lm" and loaded.path == tmp_path / "out" and loaded.arch.block_size == 32
    assert torch.equal(outputs(model, "lm")[0], outputs(loaded.model, "lm")[0])


def test_an_older_checkpoint_without_config_yaml_still_loads(run, tmp_path):
    old = tmp_path / "old" / "checkpoint-3"
    shutil.copytree(run / "checkpoint-3", old)
    (old / "config.yaml").unlink()
    sums = json.loads((old / "checksums.json").read_text())
    del sums["config.yaml"]
    (old / "checksums.json").write_text(json.dumps(sums))
    assert checkpoint.problem(old) is None
    model = RLMModel.from_pretrained(tmp_path / "old")
    assert torch.equal(outputs(model, "lm")[0], outputs(RLMModel.from_pretrained(run), "lm")[0])
    changed = tmp_path / "changed" / "checkpoint-3"
    shutil.copytree(run / "checkpoint-3", changed)
    with (changed / "config.yaml").open("a") as f:
        f.write("# edited\n")
    assert "config.yaml does not match its checksum" in checkpoint.problem(changed)


def one_line_error(call, *args) -> str:
    with pytest.raises(UserError) as e:
        call(*args)
    assert len(str(e.value).splitlines()) == 1
    return str(e.value)


def test_another_family_a_missing_directory_or_no_model_is_one_clear_error(run, tmp_path):
    msg = one_line_error(GPT.from_pretrained, run / "checkpoint-3")
    assert "holds a model of family rlm" in msg and "not a GPT" in msg and "RLMModel.from_pretrained" in msg
    assert "not a ACT" in one_line_error(ACT.from_pretrained, run)
    assert "no such checkpoint or run directory" in one_line_error(RLMModel.from_pretrained, tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    assert "no whole checkpoint-<step> directory there" in one_line_error(RLMModel.from_pretrained, tmp_path / "empty")
    model = RLMModel.from_pretrained(run)
    assert "holds more than a saved model" in one_line_error(model.save_pretrained, run)
    weights = model.save_pretrained(tmp_path / "saved") / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    assert "model.safetensors does not match its checksum" in one_line_error(RLMModel.from_pretrained, weights.parent)
    assert sorted(p.name for p in run.iterdir() if p.name.startswith("checkpoint-")) == ["checkpoint-3"]
