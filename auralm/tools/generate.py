"""Text generation for ``task=lm``: continue a prompt with a KV cache and temperature, top-k, top-p sampling.

:func:`generate` uses the model's KV cache when it has one (``new_cache()`` and ``step(ids, cache)``:
GPT and RLM), else it recomputes the window at every token. Past ``block_size`` the window slides:
every new token is computed over the last ``block_size`` tokens, exactly as without a cache (so each
such token costs a whole window, cache or not). Sampling draws from a ``torch.Generator`` of its own:
the global random state, which training uses, is never touched. Temperature 0 is greedy.

``hrmctl generate CHECKPOINT --prompt TEXT [--max-new-tokens 64] [--temperature 0.8] [--top-k 50] [--top-p 1.0]
[--seed 0] [--data DIR] [--json]`` (its options: cli/tools/generate.py) calls :func:`continue_prompt`. The
tokenizer is the one of the data the run trained on (its data directory, or ``--data``).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch

from auralm import tasks
from auralm.errors import UserError


def check_settings(temperature: float, top_k: int, top_p: float) -> None:
    """ValueError naming the first setting out of range."""
    if not temperature >= 0:  # also NaN
        raise ValueError(f"temperature must be 0 (greedy) or more, not {temperature}")
    if top_k < 0:
        raise ValueError(f"top_k must be 0 (off) or more, not {top_k}")
    if not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1] (1 = off), not {top_p}")


def filter_logits(logits: torch.Tensor, temperature: float, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """``logits`` (..., vocab) divided by ``temperature``, with -inf for the tokens top-k and top-p leave out:
    top-k keeps the ``top_k`` most likely (0: off); top-p keeps the smallest set of the most likely tokens whose
    probability reaches ``top_p`` (1.0: off), never fewer than one. ``temperature`` > 0 here (0 is greedy)."""
    logits = logits / temperature
    vocab = logits.shape[-1]
    if 0 < top_k < vocab:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        before = torch.cumsum(probs, dim=-1) - probs  # the mass of the more likely tokens
        drop = before >= top_p  # already reached without this token; the first token is always kept
        drop[..., 0] = False
        logits = logits.masked_fill(drop.scatter(-1, order, drop), float("-inf"))
    return logits


def sample(logits: torch.Tensor, temperature: float = 0.8, top_k: int = 0, top_p: float = 1.0,
           generator: torch.Generator | None = None) -> torch.Tensor:
    """One token per row of ``logits`` (B, vocab) -> (B,): the argmax when ``temperature`` is 0, else a draw
    from the filtered distribution with ``generator`` (None: a fresh one seeded 0, never the global RNG)."""
    if temperature == 0:
        return logits.argmax(dim=-1)
    probs = torch.softmax(filter_logits(logits.float(), temperature, top_k, top_p), dim=-1)
    if generator is None:
        generator = torch.Generator(device=probs.device).manual_seed(0)
    draw_on = generator.device
    return torch.multinomial(probs.to(draw_on), 1, generator=generator).squeeze(-1).to(logits.device)


@torch.no_grad()
def generate(model, ids: torch.Tensor, max_new_tokens: int, temperature: float = 0.8, top_k: int = 50,
             top_p: float = 1.0, generator: torch.Generator | None = None, stop=None) -> torch.Tensor:
    """``ids`` (T,) or (B, T) followed by up to ``max_new_tokens`` new tokens, in the same shape.

    ``stop``: token ids that end a row; the row keeps that token and repeats it while other rows go on, and
    generation ends when every row has stopped. The model runs in eval mode (its mode is restored after)."""
    check_settings(temperature, top_k, top_p)
    one = ids.dim() == 1
    x = ids.view(1, -1) if one else ids
    if x.dim() != 2 or x.shape[1] == 0:
        raise ValueError(f"ids must be (T,) or (B, T) with T > 0, not {tuple(ids.shape)}")
    if generator is None and temperature > 0:
        generator = torch.Generator(device=x.device).manual_seed(0)
    block = model.block_size
    cached = hasattr(model, "new_cache") and hasattr(model, "step")
    stop_ids = torch.tensor(sorted(set(stop)), device=x.device) if stop else None
    done = torch.zeros(x.shape[0], dtype=torch.bool, device=x.device)
    was = model.training
    model.eval()
    try:
        cache = None
        for _ in range(max_new_tokens):
            if not cached:
                logits = model(x[:, -block:])[0][:, -1]
            elif cache is None or cache.length >= block:  # the first window, or the cache is full: a fresh one
                cache = model.new_cache()
                logits = model.step(x[:, -block:], cache)[:, -1]
            else:
                logits = model.step(x[:, -1:], cache)[:, -1]
            nxt = sample(logits, temperature, top_k, top_p, generator)
            if stop_ids is not None:
                nxt = torch.where(done, x[:, -1], nxt)
                done |= torch.isin(nxt, stop_ids)
            x = torch.cat([x, nxt[:, None]], dim=1)
            if stop_ids is not None and bool(done.all()):
                break
    finally:
        model.train(was)
    return x[0] if one else x


# ---------------------------------------------------------------- the command


def _tokenizer(data_dir: Path, explicit: bool, task: str):
    """The tokenizer of the ``task`` data in ``data_dir`` (its manifest names it), or a UserError saying what is
    missing."""
    from auralm.data import datadir

    if not (data_dir / "meta.json").is_file():
        where = "" if explicit else " (the data directory the run trained on" + (
            ")" if data_dir.is_absolute() else ", relative to where it was started)")
        raise UserError(f"the tokenizer is in the data directory {data_dir}{where}, and it is not there: "
                        f"bring it here (`hrmctl sync-data`) or pass --data DIR")
    try:
        meta = json.loads((data_dir / "meta.json").read_text())
        path = data_dir / meta["tokenizer"]["path"]
    except (ValueError, KeyError, TypeError):
        raise UserError(f"{data_dir}/meta.json names no tokenizer: is it the run's lm data?") from None
    if meta.get("task") != task:
        raise UserError(f"{data_dir} holds {meta.get('task')!r} data, not the run's {task} data")
    if not path.exists():
        raise UserError(f"{data_dir} has no tokenizer at {path}: prepare or sync the data again")
    return datadir.load_tokenizer(path)


def continue_prompt(checkpoint: Path, prompt: str, max_new_tokens: int, temperature: float, top_k: int,
                    top_p: float, seed: int, data: Path | None) -> dict:
    """What ``hrmctl generate`` prints (its options: cli/tools/generate.py): ``prompt`` continued by the language
    model of ``checkpoint`` with the tokenizer of its data (``data``, else the directory the run trained on): the
    prompt, the new text, its tokens, the seconds and tokens/s, the checkpoint. Bad input is one UserError."""
    from auralm.tools.inference import load

    try:
        check_settings(temperature, top_k, top_p)
    except ValueError as e:
        raise UserError("--" + str(e).replace("_", "-")) from None
    loaded = load(Path(checkpoint))
    if loaded.task not in tasks.names() or not tasks.get(loaded.task).tokenized:  # text: its data's tokenizer
        raise UserError(f"{loaded.path} is a task={loaded.task} model, not a language model: "
                        f"for sudoku use `hrmctl solve`")
    if not hasattr(loaded.model, "block_size") or getattr(loaded.model, "recurrent", False):
        raise UserError(f"{loaded.path}: generation supports the gpt and rlm families, not this model")
    tokenizer = _tokenizer(Path(data) if data else loaded.data_dir, bool(data), loaded.task)
    ids = tokenizer(prompt)["input_ids"] or [tokenizer.eos_token_id]  # nothing to continue: start a text
    generator = torch.Generator().manual_seed(seed)
    start = time.perf_counter()
    out = generate(loaded.model, torch.tensor(ids), max_new_tokens, temperature, top_k, top_p, generator,
                   stop=[tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else None).tolist()
    seconds = time.perf_counter() - start
    new = out[len(ids):]
    whole, head = tokenizer.decode(out), tokenizer.decode(ids)
    text = whole[len(head):] if whole.startswith(head) else tokenizer.decode(new)
    return {"prompt": prompt, "text": text, "tokens": len(new), "seconds": round(seconds, 4),
            "tokens_per_s": round(len(new) / seconds, 2) if seconds > 0 else None, "checkpoint": str(loaded.path)}
