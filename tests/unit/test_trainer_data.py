"""prepare-data (lm and sudoku) and the trainer's data reading: determinism, manifest, bad input, sharding."""

from __future__ import annotations

import json
from itertools import islice

import numpy as np
import pytest

from auralm.data import datadir
from auralm.errors import UserError
from tests.trainer.helpers import QUIJOTE, prepare_data, small_sudoku

LM_ARGS = ["--vocab-size", "512", "--max-tokens", "40000"]


@pytest.fixture(scope="module")
def quijote(tmp_path_factory):
    out = tmp_path_factory.mktemp("lm") / "quijote"
    assert prepare_data([str(QUIJOTE), "--out", str(out), *LM_ARGS]) == 0
    return out


def test_lm_data_has_a_manifest_shards_and_a_tokenizer_transformers_loads(quijote):
    from transformers import AutoTokenizer

    meta = datadir.load_manifest(quijote, "lm")
    assert meta["dtype"] == "uint16" and meta["tokenizer"]["vocab_size"] == 512
    assert meta["splits"]["train"]["tokens"] + meta["splits"]["val"]["tokens"] == 40000
    assert meta["source"]["files"][str(QUIJOTE.resolve())] == "485be638d952a55acbb944c964d0429418ca2da711df7bc48a36c612129ead9b"
    tokens = np.fromfile(quijote / "train_000.bin", dtype=np.uint16)
    assert len(tokens) == meta["splits"]["train"]["tokens"] and tokens.max() < 512
    tok = AutoTokenizer.from_pretrained(quijote / "tokenizer")
    text = "En un lugar de la Mancha, de cuyo nombre no quiero acordarme"
    assert tok.decode(tok(text)["input_ids"]) == text
    assert "Quijote" in tok.decode(tokens[:300].tolist())


def test_the_trainers_sample_tokenizer_encodes_and_decodes_as_transformers_does_without_importing_it(quijote):
    import subprocess
    import sys

    from transformers import AutoTokenizer

    ref = AutoTokenizer.from_pretrained(quijote / "tokenizer")
    tok = datadir.sample_tokenizer(quijote / "tokenizer")
    assert isinstance(tok, datadir.SampleTokenizer)
    tokens = np.fromfile(quijote / "train_000.bin", dtype=np.uint16)[:400].tolist()
    for text in ("En un lugar de la Mancha, de cuyo nombre no quiero acordarme", "  ¿Qué? ¡Sí! n't 's ,", ""):
        assert tok(text)["input_ids"] == ref(text)["input_ids"]
    eos = ref.eos_token_id
    for ids in (tokens, [eos, *tokens[:50], eos], []):
        assert tok.decode(ids) == ref.decode(ids)
    code = ("import sys; from auralm.data import datadir; t = datadir.sample_tokenizer(sys.argv[1]); "
            "t.decode(t('hola')['input_ids']); print('transformers' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code, str(quijote / "tokenizer")], capture_output=True, text=True)
    assert out.stdout.strip() == "False", out.stderr


def test_a_tokenizer_that_asks_to_clean_up_spaces_is_left_to_transformers(quijote, tmp_path):
    """(transformers decides what the clean-up does: for a BPE tokenizer as here, nothing)"""
    import shutil

    tokdir = tmp_path / "tokenizer"
    shutil.copytree(quijote / "tokenizer", tokdir)
    config = json.loads((tokdir / "tokenizer_config.json").read_text())
    (tokdir / "tokenizer_config.json").write_text(json.dumps(dict(config, clean_up_tokenization_spaces=True)))
    tok = datadir.sample_tokenizer(tokdir)
    assert not isinstance(tok, datadir.SampleTokenizer) and type(tok).__module__.startswith("transformers")


def test_prepare_is_deterministic_and_a_rerun_is_a_no_op(quijote, tmp_path, capsys):
    again = tmp_path / "again"
    assert prepare_data([str(QUIJOTE), "--out", str(again), *LM_ARGS]) == 0
    assert (again / "meta.json").read_bytes() == (quijote / "meta.json").read_bytes()
    before = {p.name: p.stat().st_mtime_ns for p in again.rglob("*")}
    capsys.readouterr()
    assert prepare_data([str(QUIJOTE), "--out", str(again), *LM_ARGS]) == 0
    assert capsys.readouterr().out.startswith("up to date")
    assert {p.name: p.stat().st_mtime_ns for p in again.rglob("*")} == before


def test_text_length_filters_and_jsonl_input(tmp_path):
    lines = [{"text": "corto"}, {"text": "una línea bastante más larga que la otra, " * 3}] * 50
    src = tmp_path / "docs.jsonl"
    src.write_text("\n".join(json.dumps(x, ensure_ascii=False) for x in lines))
    assert prepare_data([str(src), "--out", str(tmp_path / "all"), "--vocab-size", "300"]) == 0
    assert prepare_data([str(src), "--out", str(tmp_path / "long"), "--vocab-size", "300", "--min-text-length", "10"]) == 0
    tokens = {n: sum(s["tokens"] for s in json.loads((tmp_path / n / "meta.json").read_text())["splits"].values())
              for n in ("all", "long")}
    assert 0 < tokens["long"] < tokens["all"]


def test_sudoku_data_is_deterministic(tmp_path):
    a, b = small_sudoku(tmp_path / "a", 200), small_sudoku(tmp_path / "b", 200)
    assert (a / "meta.json").read_bytes() == (b / "meta.json").read_bytes()
    meta = datadir.load_manifest(a, "sudoku")
    assert meta["splits"]["train"]["puzzles"] == 180 and meta["splits"]["val"]["puzzles"] == 20
    x, y = datadir.Puzzles(a, meta, "train").batch([0, 1])
    assert x.shape == (2, 81) and ((x == 0) == (y != -100)).all() and y.max() <= 8


@pytest.mark.parametrize("args, message", [
    (["/nonexistent/corpus.txt"], "does not exist"),
    (["EMPTY"], "is empty"),
    (["QUIJOTE", "--vocab-size", "70000", "--dtype", "uint16"], "does not fit the uint16 shard width"),
    (["QUIJOTE", "--min-text-length", "10000000"], "has no text between"),
    ([], "missing SOURCE"),
    (["--task", "sudoku", "--count", "1"], "too small"),
])
def test_bad_input_is_one_line_exit_2_and_overwrites_nothing(quijote, tmp_path, capsys, args, message):
    (tmp_path / "EMPTY").mkdir()
    args = [{"EMPTY": str(tmp_path / "EMPTY"), "QUIJOTE": str(QUIJOTE)}.get(a, a) for a in args]
    before = {p.name: p.read_bytes() for p in quijote.rglob("*") if p.is_file()}
    assert prepare_data([*args, "--out", str(quijote)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and message in err
    assert {p.name: p.read_bytes() for p in quijote.rglob("*") if p.is_file()} == before


def test_a_directory_that_is_not_data_is_not_overwritten(tmp_path, capsys):
    (tmp_path / "mine.txt").write_text("keep me")
    assert prepare_data(["--task", "sudoku", "--count", "20", "--out", str(tmp_path)]) == 2
    assert "not a data directory" in capsys.readouterr().err
    assert (tmp_path / "mine.txt").read_text() == "keep me"


def test_a_manifest_that_does_not_match_its_files_is_refused(tmp_path):
    d = small_sudoku(tmp_path / "s", 50)
    with open(d / "train_000.bin", "r+b") as f:
        f.write(b"\x09")
    with pytest.raises(UserError, match="does not match its manifest: train_000.bin has changed"):
        datadir.load_manifest(d, "sudoku")
    d2 = small_sudoku(tmp_path / "s2", 50)
    (d2 / "val_000.bin").unlink()
    with pytest.raises(UserError, match="val_000.bin is missing"):
        datadir.load_manifest(d2, "sudoku")
    with pytest.raises(UserError, match="no data in"):
        datadir.load_manifest(tmp_path / "nothing", "lm")


class _Ids:
    """A dataset whose batch is the indices themselves, to see what each rank is given."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def batch(self, indices):
        return list(indices)


def test_ranks_get_disjoint_batches_reshuffled_each_epoch_and_resume_mid_epoch():
    n, bs, world = 40, 4, 2
    per_epoch = n // world // bs
    epochs = {r: [sum(islice(datadir.batches(_Ids(n), bs, r, world, seed=0, start=e * per_epoch), per_epoch), [])
                  for e in range(2)] for r in range(world)}
    for e in range(2):
        assert not set(epochs[0][e]) & set(epochs[1][e])
        assert sorted(epochs[0][e] + epochs[1][e]) == list(range(n))
    assert epochs[0][0] != epochs[0][1]  # a new order every epoch
    whole = list(islice(datadir.batches(_Ids(n), bs, 0, world, seed=0), 2 * per_epoch))
    resumed = list(islice(datadir.batches(_Ids(n), bs, 0, world, seed=0, start=3), 2 * per_epoch - 3))
    assert resumed == whole[3:]


def test_fewer_samples_than_one_batch_is_a_clear_error():
    with pytest.raises(UserError, match="fewer than one batch"):
        next(datadir.batches(_Ids(5), 4, 0, 2, seed=0))
