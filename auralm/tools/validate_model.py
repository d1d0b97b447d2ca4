"""Check a language model before training it: ``hrmctl validate-model [--json] [key=value ...]`` (its options:
cli/tools/validate_model.py), the RLM-mHC guide's ``validate_model.py``.

Builds the model the keys describe (default ``task=lm model=rlm-tiny``, vocabulary ``model.vocab_size``
or 512) and checks, each as a line with ok or FAIL: the forward pass (shape, a finite loss near
ln(vocab) at initialisation), the backward pass (every parameter gets a finite gradient, none is all
zero), the parameter count (with mHC's share), every hyper-connection's matrix H_res doubly stochastic
(at initialisation rows and columns sum to 1 within 1e-3) and the amax of the composite mixing below 2.0,
and that it can overfit one tiny batch (the loss falls below a fifth of where it started in 150 AdamW steps);
after it, every token's H_res still has columns summing to 1 within 1e-5 (Sinkhorn's last step) and the
composite mixing's amax is still below 2.0: the rows are reported, not held to 1e-3 (training makes the
logits peaked, where Sinkhorn's rows converge slowly; docs/rlm.md, "validate-model").
Exit 0 when every check passes, 1 when one fails, 2 for bad keys or a model this machine cannot hold.
"""

from __future__ import annotations

import math
import time

import torch

from auralm import models, tasks
from auralm.planning import sizing
from auralm.training import command_line, config
from auralm.errors import UserError
from auralm.models import registry
from auralm.models.registry import check_result as _check
from auralm.models.args import ModelArgs

DEFAULTS = ["task=lm", "model=rlm-tiny"]
VOCAB = 512


def build(overrides: list[str]) -> tuple[config.Config, dict, torch.nn.Module]:
    cfg = command_line.parse(DEFAULTS + overrides)
    arch = config.resolved_model(cfg.model)
    family = registry.of(cfg.task, arch)
    if not tasks.get(cfg.task).tokenized or not family.validates:  # a language model: text, and a family that takes it
        takes = " or ".join(f.name for f in registry.families() if f.validates)
        raise UserError(f"validate-model checks the language models (task=lm with the {takes} sizes), not "
                        f"task={cfg.task} model={cfg.model.name}; for sudoku models use `hrmctl train --dry-run`")
    vocab = getattr(arch, "vocab_size", None) or VOCAB
    need = sizing.estimate(cfg, vocab)["total_bytes"]
    import psutil

    have = psutil.virtual_memory().available
    if need > 0.8 * have:
        raise UserError(f"model={cfg.model.name} needs about {need / 2**30:.1f} GiB here (training.batch_size="
                        f"{cfg.training.batch_size}), {have / 2**30:.1f} GiB are free: validate a smaller size "
                        f"(model=rlm-tiny) or lower training.batch_size")
    torch.manual_seed(cfg.training.seed)
    return cfg, arch, models.build(cfg.task, arch, vocab)


def validate(cfg: config.Config, arch: ModelArgs, model: torch.nn.Module) -> list[dict]:
    out = []
    vocab = model.lm_head.weight.shape[0] if hasattr(model, "lm_head") else model.wte.weight.shape[0]
    g = torch.Generator().manual_seed(0)
    T = min(arch.block_size, 64)
    x = torch.randint(0, vocab, (4, T + 1), generator=g)
    inp, tgt = x[:, :-1], x[:, 1:]

    total = sum(p.numel() for p in model.parameters())
    hc = sum(p.numel() for n, p in model.named_parameters() if "_hc." in n)
    out.append(_check("parameters", total > 0, f"{total / 1e6:.2f}M" + (f" ({hc / 1e6:.3f}M in the hyper-connections, "
                                                                        f"{100 * hc / total:.2f}%)" if hc else "")))
    model.eval()
    with torch.no_grad():
        logits, loss = model(inp, tgt)
    expected = math.log(vocab)
    out.append(_check("forward", logits.shape == (4, T, vocab) and math.isfinite(float(loss))
                      and abs(float(loss) - expected) < 0.25 * expected,
                      f"logits {tuple(logits.shape)}, loss {float(loss):.3f} at initialisation (ln vocab = "
                      f"{expected:.3f})"))
    model.train()
    _, loss = model(inp, tgt)
    loss.backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None or not bool(p.grad.abs().sum() > 0)]
    bad = [n for n, p in model.named_parameters() if p.grad is not None and not bool(torch.isfinite(p.grad).all())]
    out.append(_check("backward", not missing and not bad,
                      "every parameter has a finite, non-zero gradient" if not missing and not bad else
                      f"no gradient: {missing[:3]}; not finite: {bad[:3]}"))
    model.zero_grad(set_to_none=True)

    own = registry.of(cfg.task, arch).validate_checks  # the family's own checks (the RLM's: mHC's matrices)
    out.extend(own(model, False) if own else [])

    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    began, first = time.perf_counter(), None
    for _ in range(150):
        _, loss = model(inp, tgt)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        first = float(loss.detach()) if first is None else first
    last = float(loss.detach())
    out.append(_check("overfit one batch", last < first / 5,
                      f"loss {first:.3f} -> {last:.3f} in 150 steps ({time.perf_counter() - began:.1f} s)"))
    out.extend(own(model, True) if own else [])
    return out


def check(overrides: list[str]) -> dict:
    """What ``hrmctl validate-model`` reports (its options: cli/tools/validate_model.py): the model the keys describe,
    built and checked (:func:`validate`); its name, family, whether every check passed, and the checks."""
    cfg, arch, model = build(overrides)
    results = validate(cfg, arch, model)
    mhc = f", mHC n={arch.mhc_flows}" if getattr(arch, "mhc_enabled", False) else ""
    return {"model": cfg.model.name, "family": f"{models.family_of(cfg.task, arch)}{mhc}",
            "ok": all(r["ok"] for r in results), "checks": results}
