"""Generation (auralm.tools.generate): the KV cache gives the tokens recomputation gives, past block_size too; top-k and
top-p keep the right tokens; a seed makes the text; the evaluation sample leaves training's RNG alone; and
`hrmctl generate` continues a prompt with a tiny model trained on the Quijote."""

from __future__ import annotations

import contextlib
import io
import json
import subprocess

import pytest
import torch

from auralm import models
from auralm.data import datadir
from auralm import tasks
from auralm.training import command_line, config, train
from auralm.tools.generate import filter_logits, generate, sample
from cli.app import main as hrmctl
from tests.trainer.helpers import PYTHON, REPO, python_env

VOCAB = 97
RLM_SMALL = ("model.hidden_dim=64", "model.num_heads=2", "model.head_dim=32", "model.ffn_dim=128", "model.num_layers=2")


pytestmark = pytest.mark.usefixtures("one_thread")


def build(*overrides: str, vocab: int = VOCAB) -> torch.nn.Module:
    cfg = command_line.parse(["task=lm", *overrides])
    torch.manual_seed(0)
    return models.build("lm", config.resolved_model(cfg.model), vocab)


class NoCache(torch.nn.Module):
    """The same model with its cache hidden: generate() recomputes the window at every token."""

    def __init__(self, model):
        super().__init__()
        self.model, self.block_size = model, model.block_size

    def forward(self, x):
        return self.model(x)


MODELS = {"gpt": ("model=tiny", "model.block_size=16"),
          "rlm-mhc": ("model=rlm-tiny", *RLM_SMALL, "model.block_size=16"),
          "rlm-plain": ("model=rlm-tiny", *RLM_SMALL, "model.block_size=16", "model.mhc_enabled=false")}


@pytest.mark.parametrize("name", list(MODELS))
def test_cached_greedy_generation_equals_recomputation_past_block_size(name):
    model = build(*MODELS[name])
    assert hasattr(model, "new_cache") and model.block_size == 16
    prompts = torch.randint(0, VOCAB, (2, 20), generator=torch.Generator().manual_seed(1))
    for prompt in (prompts[:, :5], prompts):  # shorter than the block, and longer
        cached = generate(model, prompt, 30, temperature=0)
        plain = generate(NoCache(model), prompt, 30, temperature=0)
        assert cached.shape == (2, prompt.shape[1] + 30)
        assert torch.equal(cached[:, :prompt.shape[1]], prompt)
        assert cached.tolist() == plain.tolist()
    one = generate(model, prompts[0, :5], 12, temperature=0)  # 1D in, 1D out
    assert one.tolist() == generate(model, prompts[:1, :5], 12, temperature=0)[0].tolist()
    model.train()
    generate(model, prompts[:, :5], 3)
    assert model.training  # its mode is restored


def test_the_cache_step_matches_the_forward_logits():
    model = build(*MODELS["gpt"]).eval()
    x = torch.randint(0, VOCAB, (2, 16), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        full = model(x)[0]
        cache = model.new_cache()
        parts = torch.cat([model.step(x[:, :7], cache), model.step(x[:, 7:8], cache), model.step(x[:, 8:], cache)], 1)
        assert cache.length == 16
        torch.testing.assert_close(parts, full, atol=1e-5, rtol=1e-4)
        with pytest.raises(ValueError, match="block_size"):
            model.step(x[:, :1], cache)


def test_stop_ends_a_row_and_repeats_its_stop_token():
    model = build(*MODELS["gpt"])
    prompt = torch.randint(0, VOCAB, (1, 4), generator=torch.Generator().manual_seed(3))
    free = generate(model, prompt, 10, temperature=0)[0, 4:].tolist()
    stopped = generate(model, prompt, 10, temperature=0, stop=[free[2]])[0, 4:].tolist()
    assert stopped == free[:free.index(free[2]) + 1]


def test_top_k_and_top_p_keep_exactly_the_right_tokens():
    probs = torch.tensor([0.0625, 0.5, 0.03125, 0.25, 0.125, 0.03125])  # by rank: 1, 3, 4, 0, then 2 and 5
    logits = probs.log()

    def kept(**kw):
        return set(torch.nonzero(torch.isfinite(filter_logits(logits, 1.0, **kw))).flatten().tolist())

    assert kept() == set(range(6))
    assert kept(top_k=1) == {1}
    assert kept(top_k=3) == {1, 3, 4}
    assert kept(top_k=6) == kept(top_k=0) == set(range(6))
    assert kept(top_p=0.5) == {1}  # 0.5 reaches 0.5
    assert kept(top_p=0.3) == {1}
    assert kept(top_p=0.75) == {1, 3}
    assert kept(top_p=0.76) == {1, 3, 4}
    assert kept(top_p=0.9) == {1, 3, 4, 0}
    assert kept(top_p=1e-6) == {1}  # always at least one
    assert kept(top_k=2, top_p=0.9) == {1, 3}  # top-p over what top-k left
    rows = torch.stack([logits, logits.flip(0)])  # per row
    keep = torch.isfinite(filter_logits(rows, 1.0, top_p=0.75))
    assert keep[0].nonzero().flatten().tolist() == [1, 3] and keep[1].nonzero().flatten().tolist() == [2, 4]
    torch.testing.assert_close(filter_logits(logits, 2.0), logits / 2)
    g = torch.Generator().manual_seed(0)
    draws = sample(logits.expand(2000, 6), 1.0, top_k=3, generator=g)
    counts = torch.bincount(draws, minlength=6) / 2000
    assert set(draws.unique().tolist()) == {1, 3, 4}
    assert abs(counts[1] - 0.5 / 0.875) < 0.05 and abs(counts[4] - 0.125 / 0.875) < 0.05  # renormalised
    assert sample(logits[None], 0.0).tolist() == [1]  # temperature 0: argmax


def test_the_same_seed_gives_the_same_text_another_seed_another_and_the_global_rng_is_untouched():
    model = build(*MODELS["rlm-mhc"])
    prompt = torch.tensor([5, 6, 7])
    state = torch.get_rng_state()
    a = generate(model, prompt, 20, temperature=1.0, top_k=0, generator=torch.Generator().manual_seed(1))
    b = generate(model, prompt, 20, temperature=1.0, top_k=0, generator=torch.Generator().manual_seed(1))
    c = generate(model, prompt, 20, temperature=1.0, top_k=0, generator=torch.Generator().manual_seed(2))
    assert torch.equal(torch.get_rng_state(), state)
    assert a.tolist() == b.tolist() and a.tolist() != c.tolist()
    for bad in (dict(temperature=-1.0), dict(top_k=-1), dict(top_p=0.0), dict(top_p=1.5)):
        with pytest.raises(ValueError):
            generate(model, prompt, 2, **bad)


@pytest.fixture(scope="module")
def quijote(quijote_data):
    return quijote_data(300, 20000)


@pytest.mark.parametrize("name", ["gpt", "rlm-mhc"])
def test_the_evaluation_sample_is_seeded_by_step_and_leaves_the_training_rng_alone(quijote, name):
    cfg = command_line.parse(["task=lm", f"data_dir={quijote}", *MODELS[name][:-1], "model.block_size=32",
                        "training.eval_batches=1", "training.batch_size=4", "training.sample_tokens=12",
                        "training.sample_prompt=En un lugar"])
    meta = datadir.load_manifest(quijote, "lm")
    torch.manual_seed(0)
    model = models.build("lm", config.resolved_model(cfg.model), meta["tokenizer"]["vocab_size"]).train()
    val = tasks.open_split(quijote, meta, "val", 32)
    tokenizer = datadir.load_tokenizer(quijote / meta["tokenizer"]["path"])
    torch.manual_seed(123)
    state = torch.get_rng_state()
    first = train.evaluate(model, val, cfg, torch.device("cpu"), tokenizer, step=10)
    assert torch.equal(torch.get_rng_state(), state)
    assert model.training
    again = train.evaluate(model, val, cfg, torch.device("cpu"), tokenizer, step=10)
    later = train.evaluate(model, val, cfg, torch.device("cpu"), tokenizer, step=20)
    assert first["sample"].startswith("En un lugar") and first["sample"] == again["sample"]
    assert later["sample"] != first["sample"]
    assert torch.equal(torch.get_rng_state(), state)


@pytest.fixture(scope="module")
def lm_run(quijote, tmp_path_factory):
    """A tiny RLM trained a few steps, with a checkpoint; and what it printed."""
    run = tmp_path_factory.mktemp("run") / "rlm"
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        code = train.main(["task=lm", f"data_dir={quijote}", f"out_dir={run}", "model=rlm-tiny", *RLM_SMALL,
                           "model.block_size=32", "training.batch_size=8", "training.max_steps=6",
                           "training.warmup_steps=2", "training.log_interval=3", "training.eval_interval=6",
                           "training.eval_batches=1", "training.checkpoint_interval=0",
                           "training.sample_prompt=En un lugar", "training.sample_tokens=8"])
    assert code == 0
    return run, printed.getvalue()


def test_an_rlm_run_prints_an_evaluation_sample(lm_run):
    samples = [line for line in lm_run[1].splitlines() if line.startswith("sample: ")]
    assert len(samples) == 1 and json.loads(samples[0][len("sample: "):]).startswith("En un lugar"), lm_run[1]


def _generate(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([PYTHON, "-m", "cli", "generate", *args], capture_output=True, text=True,
                          env=python_env(), cwd=REPO, timeout=120)


@pytest.mark.slow  # seconds of real work (a training, hrmctl train, a compile): not in --fast (issue 35, item 6)
def test_generate_continues_the_prompt_and_says_what_is_wrong_in_one_line(lm_run, capsys):
    lm_run = lm_run[0]
    res = _generate(str(lm_run), "--prompt", "En un lugar", "--max-new-tokens", "8", "--seed", "1")
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("En un lugar") and len(res.stdout.strip()) > len("En un lugar")
    res = _generate(str(lm_run), "--prompt", "En un lugar", "--max-new-tokens", "8", "--seed", "1", "--top-p", "0",
                    "--json")
    assert res.returncode == 2 and res.stdout == ""
    assert res.stderr.count("\n") == 1 and res.stderr.startswith("error: --top-p") and "Traceback" not in res.stderr
    # in this process: --json, the seed, and the other wrong uses
    assert hrmctl(["generate", str(lm_run), "--prompt", "En un lugar", "--max-new-tokens", "8", "--seed", "1",
                   "--json"]) == 0
    one = json.loads(capsys.readouterr().out)
    assert set(one) >= {"prompt", "text", "tokens", "seconds", "tokens_per_s"}
    assert one["prompt"] == "En un lugar" and 1 <= one["tokens"] <= 8
    assert hrmctl(["generate", str(lm_run), "--prompt", "En un lugar", "--max-new-tokens", "8", "--seed", "1",
                   "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["text"] == one["text"]
    for bad, words in [(["--temperature", "-1"], "--temperature"), (["--top-k", "-2"], "--top-k"),
                       (["--top-p", "1.5"], "--top-p"), (["--max-new-tokens", "0"], "--max-new-tokens"),
                       (["--data", str(lm_run / "nowhere")], "nowhere")]:
        assert hrmctl(["generate", str(lm_run), "--prompt", "x", *bad]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and err.count("\n") == 1 and words in err, err


def test_generate_is_a_command_of_hrmctl():
    from cli.app import app

    assert "generate" in [c.name for c in app.registered_commands]
