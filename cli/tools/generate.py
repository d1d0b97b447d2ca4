"""`hrmctl generate`: a prompt continued by a trained language model (auralm.tools.generate.continue_prompt)."""

from __future__ import annotations

from typing import Annotated

import typer

from cli.tools.common import Checkpoint, DataDir, JsonOut, user_errors


def generate(checkpoint: Checkpoint,
             prompt: Annotated[str, typer.Option(show_default=False, help="The text to continue.")],
             max_new_tokens: Annotated[int, typer.Option(min=1, help="Tokens to add.")] = 64,
             temperature: Annotated[float, typer.Option(min=0, help="0 = greedy.")] = 0.8,
             top_k: Annotated[int, typer.Option(min=0, help="Sample among the K most likely tokens; 0 = off.")] = 50,
             top_p: Annotated[float, typer.Option(
                 help="Sample among the most likely tokens that make up P of the probability, 0 < P <= 1; 1 = off.")]
             = 1.0,
             seed: Annotated[int, typer.Option(help="The sampling seed: the same seed, the same text.")] = 0,
             data: DataDir("The data directory with the tokenizer (default: the one the run trained on).") = None,
             json_out: JsonOut = False) -> int:
    """Continue a prompt with a trained language model (KV cache; temperature, top-k, top-p sampling)."""
    import json

    with user_errors():
        from auralm.tools.generate import continue_prompt

        out = continue_prompt(checkpoint, prompt, max_new_tokens, temperature, top_k, top_p, seed, data)
    print(json.dumps(out, ensure_ascii=False) if json_out else out["prompt"] + out["text"])
    return 0
