"""The optimizer and the learning-rate schedule.

Parameter groups: matrices with weight decay, vectors (norm scales, biases) without (with it under
``training.decay_vectors``, as HRM's and TRM's optimizer takes every parameter: the recipes), and the
puzzle embedding with its own ``puzzle_emb_lr`` and ``puzzle_emb_weight_decay``. Each group keeps
``lr_scale`` (its lr over the base lr), so the schedule sets every group from one number.

``training.puzzle_emb_optimizer=sign_sgd`` steps the puzzle embedding as HRM's and TRM's
``CastedSparseEmbeddingSignSGD`` does: ``p <- p (1 - lr wd) - lr sign(grad)``, its group marked ``sign_sgd`` in
the same optimizer (one state, one schedule, one checkpoint), the rest by the optimizer's own rule.
``training.optimizer=adam_atan2_if_installed`` (the recipes') is AdamATan2 where ``adam-atan2-pytorch`` is
installed and AdamW with the same betas, rate and decay where it is not, said on the rank's stderr.

AdamW (and DiLoCo's outer SGD) are torch's own. Their first step imports torch's compiler (torch._dynamo, about
1 s of CPU once a rank): the price of using torch as it is, which a run of minutes does not notice.
"""

from __future__ import annotations

import math
import sys

import torch

from auralm.training import config
from auralm.errors import UserError


def lr_at(t: config.TrainingConfig, step: int) -> float:
    """Linear warmup to ``lr`` over ``warmup_steps``, then a cosine down to ``lr * min_lr_ratio`` at ``max_steps``
    (``min_lr_ratio=1``: constant after the warmup, as in the HRM recipe). ``training.schedule=linear`` goes down in
    a straight line instead, ``constant`` stays at ``lr``."""
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
    groups = [{"params": decay, "weight_decay": t.weight_decay},
              {"params": rest, "weight_decay": t.weight_decay if t.decay_vectors else 0.0}]
    if puzzle:
        emb_lr = t.lr if t.puzzle_emb_lr is None else t.puzzle_emb_lr
        groups.append({"params": puzzle, "lr_scale": emb_lr / t.lr, "sign_sgd": t.puzzle_emb_optimizer == "sign_sgd",
                       "weight_decay": t.weight_decay if t.puzzle_emb_weight_decay is None else t.puzzle_emb_weight_decay})
    cls, kw = torch.optim.AdamW, {"fused": device.type == "cuda"}
    if t.optimizer in ("adam_atan2", "adam_atan2_if_installed"):
        try:
            from adam_atan2_pytorch import AdamAtan2
            cls, kw = AdamAtan2, {}
        except ImportError:
            if t.optimizer == "adam_atan2":
                raise UserError("training.optimizer=adam_atan2 needs the package adam-atan2-pytorch: "
                                "pip install adam-atan2-pytorch (on every node)") from None
            print("optimizer: AdamW (the recipe's AdamATan2 needs the package adam-atan2-pytorch, not installed "
                  "here: pip install adam-atan2-pytorch on every node), with the same betas, rate and decay",
                  file=sys.stderr, flush=True)
    if any(g.get("sign_sgd") for g in groups):
        cls = with_sign_sgd(cls)
    return cls(groups, lr=t.lr, betas=(t.beta1, t.beta2), **kw)


_SIGNED: dict[type, type] = {}


def with_sign_sgd(base: type) -> type:
    """``base`` whose groups marked ``sign_sgd`` are stepped by sign-SGD with decoupled weight decay (HRM's and TRM's
    puzzle embedding), the other groups by ``base``'s own step."""
    if base not in _SIGNED:
        class SignSGDGroups(base):
            @torch.no_grad()
            def step(self, closure=None):
                for group in self.param_groups:
                    if group.get("sign_sgd"):
                        for p in group["params"]:
                            if p.grad is not None:
                                p.mul_(1 - group["lr"] * group["weight_decay"]).add_(p.grad.sign(), alpha=-group["lr"])
                                p.grad = None  # the base's step leaves it alone
                return super().step(closure)

        SignSGDGroups.__name__ = f"{base.__name__}WithSignSGD"
        _SIGNED[base] = SignSGDGroups
    return _SIGNED[base]
