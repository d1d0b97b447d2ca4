"""The optimizer and the learning-rate schedule.

Parameter groups: matrices with weight decay, vectors (norm scales, biases) without, and the
puzzle embedding with its own ``puzzle_emb_lr`` and ``puzzle_emb_weight_decay``. Each group keeps
``lr_scale`` (its lr over the base lr), so the schedule sets every group from one number.

AdamW (and DiLoCo's outer SGD) are torch's own. Their first step imports torch's compiler (torch._dynamo, about
1 s of CPU once a rank): the price of using torch as it is, which a run of minutes does not notice.
"""

from __future__ import annotations

import math

import torch

from auralm.training import config
from auralm.errors import UserError


def lr_at(t: config.TrainingConfig, step: int) -> float:
    """Linear warmup to ``lr`` over ``warmup_steps``, then a cosine down to ``lr * min_lr_ratio`` at ``max_steps``
    (``min_lr_ratio=1``: constant after the warmup, as in the HRM recipe). ``training.schedule=linear`` goes down in
    a straight line instead, ``constant`` stays at ``lr`` (the RLM guide's ``training.scheduler.type``)."""
    if step <= t.warmup_steps:
        return t.lr * step / t.warmup_steps
    if t.schedule == "constant":
        return t.lr
    progress = min(1.0, (step - t.warmup_steps) / max(1, t.max_steps - t.warmup_steps))
    low = t.lr * t.min_lr_ratio
    if t.schedule == "linear":
        return t.lr - progress * (t.lr - low)
    return low + 0.5 * (1 + math.cos(math.pi * progress)) * (t.lr - low)


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for g in optimizer.param_groups:
        g["lr"] = lr * g.get("lr_scale", 1.0)



def make_optimizer(model: torch.nn.Module, t: config.TrainingConfig, device: torch.device) -> torch.optim.Optimizer:
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    puzzle = [p for n, p in named if "puzzle_emb" in n]
    decay = [p for n, p in named if p.dim() >= 2 and "puzzle_emb" not in n]
    rest = [p for n, p in named if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": t.weight_decay}, {"params": rest, "weight_decay": 0.0}]
    if puzzle:
        emb_lr = t.lr if t.puzzle_emb_lr is None else t.puzzle_emb_lr
        groups.append({"params": puzzle, "lr_scale": emb_lr / t.lr,
                       "weight_decay": t.weight_decay if t.puzzle_emb_weight_decay is None else t.puzzle_emb_weight_decay})
    if t.optimizer == "adam_atan2":
        try:
            from adam_atan2_pytorch import AdamAtan2
        except ImportError:
            raise UserError("training.optimizer=adam_atan2 needs the package adam-atan2-pytorch: "
                            "pip install adam-atan2-pytorch (on every node)") from None
        return AdamAtan2(groups, lr=t.lr, betas=(t.beta1, t.beta2))
    return torch.optim.AdamW(groups, lr=t.lr, betas=(t.beta1, t.beta2), fused=device.type == "cuda")
