"""task=lm: text, as windows of tokens of model.block_size from a tokenized corpus (hrmctl prepare-data)."""

from __future__ import annotations

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
