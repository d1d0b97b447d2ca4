"""task=lm: text, as windows of tokens of model.block_size from a tokenized corpus (hrmctl prepare-data)."""

from __future__ import annotations

from pathlib import Path

from auralm.tasks import Task


class Text(Task):
    name = "lm"
    tokenized = True
    default_vocab = 32000
    source = "corpus.txt"
    prepare_hint = ("; task=lm trains on text: corpus.txt is a local .txt, .jsonl or .parquet file (or a directory of "
                    "them), or a dataset in the Hugging Face cache by name (the HRM launcher's C4: `allenai/c4 "
                    "--config en --streaming --max-tokens 100000000`)")

    def prepare_command(self, out: str) -> str:
        import shlex

        return f"hrmctl prepare-data {self.source} --out {shlex.quote(out)}"  # task=lm: prepare-data's default

    def prepare(self, source: str | None, out: Path, options: dict) -> str:
        """A corpus (a file, a directory of them, or a dataset by name) tokenized into shards, the tokenizer trained
        on it unless one is given."""
        from auralm.data import datadir
        from auralm.errors import UserError

        if not source:
            raise UserError("missing SOURCE: give a .txt/.jsonl/.parquet file, a directory of them, or a dataset name "
                            "in the Hugging Face cache (`hrmctl prepare-data corpus.txt`), or --task sudoku for "
                            "generated puzzles")
        o = options
        return datadir.prepare_lm(source, out, o["vocab_size"], o["tokenizer"], o["max_tokens"], o["min_text_length"],
                                  o["max_text_length"], o["text_field"], o["split"], dtype=o["dtype"],
                                  shard_tokens=o["shard_tokens"], config=o["config"], streaming=o["streaming"])
