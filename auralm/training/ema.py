"""An exponential moving average of the weights (TRM's recipe): evaluated and saved beside the weights."""

from __future__ import annotations

import contextlib

import torch


class EMA:
    def __init__(self, model: torch.nn.Module, decay: float):
        self.model, self.decay = model, decay
        self.shadow = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}

    @torch.no_grad()
    def update(self) -> None:
        for n, p in self.model.named_parameters():
            if n in self.shadow:
                self.shadow[n].lerp_(p.detach(), 1 - self.decay)

    @contextlib.contextmanager
    def applied(self):
        """The model holds the averaged weights inside the block, its own again after."""
        params = dict(self.model.named_parameters())
        saved = {n: params[n].detach().clone() for n in self.shadow}
        with torch.no_grad():
            for n, v in self.shadow.items():
                params[n].copy_(v)
        try:
            yield self.model
        finally:
            with torch.no_grad():
                for n, v in saved.items():
                    params[n].copy_(v)

    def state_dict(self) -> dict:
        return {n: v.cpu() for n, v in self.shadow.items()}

    def load_state_dict(self, state: dict) -> None:
        for n, v in state.items():
            self.shadow[n].copy_(v)
