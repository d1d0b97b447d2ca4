"""prepare-data as the guides use it (issue #33, item 10): a dataset's configuration (C4's `en`, Wikipedia's dated
`20231101.es`) and streaming with a token budget. No hub here: the dataset is a local directory made in the test, in
the Hub's own layout (a README.md whose `configs:` name each configuration's files), read by `datasets` exactly as a
Hub dataset is (load_dataset(path, config, split=..., streaming=True)). The unreachable Hub is a closed local port."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from auralm.data import datadir
from tests.trainer.helpers import QUIJOTE, prepare_data

README = """\
---
configs:
- config_name: en
  data_files:
  - split: train
    path: en/*.parquet
- config_name: 20231101.es
  data_files:
  - split: train
    path: 20231101.es/*.parquet
---
# a two-language dataset in the Hub's layout
"""


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    """English (the Gutenberg licence around the novel) and Spanish (the novel) paragraphs, one configuration each."""
    text = QUIJOTE.read_text(encoding="utf-8-sig").replace("\r\n", "\n")
    start, end = text.index("*** START OF"), text.index("*** END OF")
    paragraphs = lambda part: [p.replace("\n", " ").strip() for p in part.split("\n\n") if len(p.strip()) > 40]
    english, spanish = paragraphs(text[:start] + text[end:]), paragraphs(text[start:end])
    root = tmp_path_factory.mktemp("hub") / "two-languages"
    (root / "en").mkdir(parents=True)
    (root / "20231101.es").mkdir()
    (root / "README.md").write_text(README)
    pq.write_table(pa.table({"id": list(range(len(english))), "text": english}), root / "en" / "00000.parquet")
    for n in range(4):  # four files: a stream that stops early never opens the last ones
        part = spanish[n::4]
        pq.write_table(pa.table({"id": list(range(len(part))), "text": part}), root / "20231101.es" / f"{n:05d}.parquet")
    return root, english, spanish


def _decoded(out) -> str:
    from transformers import AutoTokenizer

    meta = json.loads((out / "meta.json").read_text())
    tok = AutoTokenizer.from_pretrained(out / "tokenizer")
    ids = np.fromfile(out / meta["splits"]["train"]["files"][0], dtype=meta["dtype"])
    return tok.decode(ids.tolist())


def test_a_configuration_streamed_up_to_a_token_budget(dataset, tmp_path, monkeypatch, capsys):
    root, english, spanish = dataset
    read = []
    streamed = datadir._streamed

    def counting(*args):
        for t in streamed(*args):
            read.append(t)
            yield t

    monkeypatch.setattr(datadir, "_streamed", counting)
    out = tmp_path / "es"
    assert prepare_data([str(root), "--config", "20231101.es", "--streaming", "--max-tokens", "3000", "--vocab-size", "400",
                      "--out", str(out)]) == 0
    said = capsys.readouterr().out
    meta = json.loads((out / "meta.json").read_text())
    assert meta["splits"]["train"]["tokens"] + meta["splits"]["val"]["tokens"] == 3000  # the budget, exactly
    assert meta["source"] == {"dataset": str(root), "config": "20231101.es"}
    assert meta["options"]["config"] == "20231101.es" and meta["options"]["streaming"] is True
    assert f"streamed {root} (config 20231101.es) up to the budget of 3000 tokens" in said
    assert 0 < len(read) < len(spanish) // 4  # the stream was left long before its end (not even one file of four)
    assert set(read) <= set(spanish)
    assert "Sancho" in _decoded(out) or "Quijote" in _decoded(out)


def test_another_configuration_of_the_same_dataset_is_its_own_text(dataset, tmp_path, capsys):
    root, english, _ = dataset
    out = tmp_path / "en"
    assert prepare_data([str(root), "--config", "en", "--vocab-size", "300", "--out", str(out)]) == 0
    text = _decoded(out)
    assert "Gutenberg" in text and "Sancho" not in text
    meta = json.loads((out / "meta.json").read_text())
    assert meta["source"]["config"] == "en" and meta["options"]["streaming"] is False  # read whole


@pytest.mark.parametrize("args, line", [
    (["--config", "fr"], "error: cannot read data source {root} (config fr): "),
    (["--config", "en", "--streaming"], "error: --streaming needs --max-tokens N: the token budget at which reading "
                                        "stops"),
    (["--config", "en", "--text-field", "body"], "error: data source {root} has no 'body' column (columns: "),
])
def test_bad_dataset_options_are_one_line(dataset, tmp_path, capsys, args, line):
    root, *_ = dataset
    assert prepare_data([str(root), *args, "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(line.format(root=root)) and err.count("\n") == 1, err
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("args, line", [
    (["allenai/c4", "--config", "en", "--streaming", "--max-tokens", "1000"],
     "error: cannot stream dataset allenai/c4 (config en): 127.0.0.1 is unreachable from this machine (streaming "
     "reads the Hub as it goes); connect, or prepare the data where the Hub answers and copy it here "
     "(`hrmctl sync-data`)\n"),
    (["wikimedia/wikipedia", "--config", "20231101.es", "--max-tokens", "1000"],
     "error: cannot read dataset wikimedia/wikipedia (config 20231101.es): it is not in the local Hugging Face cache "
     "and 127.0.0.1 is unreachable; fix: run this once where it is reachable (it fills the cache, HF_HOME), or give a "
     "local .txt, .jsonl or .parquet file as SOURCE\n"),
])
def test_an_unreachable_hub_is_one_line(tmp_path, args, line):
    """The guides' own datasets, with the Hub at a closed port: hrmctl prepare-data says so in one line, exit 2."""
    env = {**os.environ, "HF_ENDPOINT": "http://127.0.0.1:9", "HF_HOME": str(tmp_path / "hf")}
    res = subprocess.run([sys.executable, "-m", "cli", "prepare-data", *args, "--out", "x"], capture_output=True,
                         text=True, timeout=180, cwd=tmp_path, env=env)
    assert (res.returncode, res.stdout, res.stderr) == (2, "", line)
    assert not (tmp_path / "x").exists()
