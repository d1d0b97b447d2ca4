"""What HRM and TRM share: input embeddings and heads around a recurrent core, and ACT with deep supervision.

A recurrent core keeps two states over the sequence (HRM: z_H and z_L; TRM: the answer y and the
latent z). One call of the core is one *segment*: the family's cycles of updates, all but the last
under ``torch.no_grad()``, ending with the states detached, so memory does not grow with the cycles.

:class:`ACT` wraps a core for training with a *carry*: each optimizer step runs one segment on
every row of the batch; the carry (states, segments run, the current examples) persists across
steps; a row that halted takes a fresh example and a reset state at the next step. Every rank
runs exactly one segment per step (plus, for HRM's Q-continue target, one more forward without
gradient), so DDP never waits on a rank whose rows halted differently.

Halting in training: after ``halt_max_steps`` segments, or when the Q-head says so (HRM:
q_halt > q_continue; TRM: q_halt > 0), but with probability ``halt_exploration_prob`` a row first
runs a random minimum of 2..halt_max_steps segments. q_halt learns whether the whole answer is
right (binary cross-entropy); HRM's q_continue learns sigmoid of the next segment's
max(q_halt, q_continue) (its q_halt at the last segment).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from auralm.models.layers import (IGNORE, SUDOKU_RELATIONS, Block, Rotary, at_least_fp32, lecun_, linear,
                                 per_token_loss, rms_norm, sudoku_positions, sudoku_relations)
from auralm.models.pretrained import Pretrained
from auralm.tasks import prefix_positions
from auralm.models.args import ModelArgs



@dataclass
class Carry:
    """What persists between optimizer steps, per row: the core's states, segments run, halted, the example."""

    z: tuple[torch.Tensor, ...]
    steps: torch.Tensor  # (B,) int64
    halted: torch.Tensor  # (B,) bool: this row takes a fresh example (and a reset state) at the next segment
    x: torch.Tensor
    y: torch.Tensor

    def state_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_state_dict(cls, d: dict, device: torch.device) -> "Carry":
        return cls(z=tuple(t.to(device) for t in d["z"]), **{k: d[k].to(device) for k in ("steps", "halted", "x", "y")})


class Level(nn.Module):
    """A stack of blocks that takes its input injection first: ``h = blocks(h + injection)``. With pre-norm
    blocks the level's output is normalised, so the state keeps its scale however often it is updated."""

    def __init__(self, n_layers: int, d: int, n_head: int, expansion: float, causal: bool, mlp_t_len: int = 0,
                 pre_norm: bool = False):
        super().__init__()
        self.layers = nn.ModuleList(Block(d, n_head, expansion, causal, mlp_t_len, pre_norm) for _ in range(n_layers))
        self.pre_norm = pre_norm
        self.grad_checkpointing = False

    def forward(self, h: torch.Tensor, injection: torch.Tensor, rope=None, bias=None) -> torch.Tensor:
        h = h + injection
        for layer in self.layers:
            if self.grad_checkpointing and torch.is_grad_enabled():
                h = checkpoint(layer, h, rope, bias, use_reentrant=False)
            else:
                h = layer(h, rope, bias)
        return rms_norm(h) if self.pre_norm else h


class RecurrentCore(nn.Module):
    """Embeddings in, two recurrent states, logits and Q out. Subclasses define ``levels()`` and ``reason()``."""

    n_states = 2

    def __init__(self, arch: ModelArgs, vocab: int, n_out: int, seq_len: int, causal: bool, num_puzzle_ids: int = 1):
        super().__init__()
        d, self.d, self.causal = arch.n_embd, arch.n_embd, causal
        self.embed_scale = math.sqrt(d)
        self.embed = nn.Embedding(vocab, d)
        lecun_(self.embed.weight.data, fan_in=d)  # std 1/sqrt(d), times sqrt(d) on the way in: unit scale
        ndim = arch.puzzle_emb_ndim
        self.n_prefix = prefix_positions(arch)  # puzzle_emb_len may add positions of zeros after the embedding's
        if self.n_prefix:  # one learned prefix per puzzle id, zero at init (own lr and weight decay)
            self.puzzle_emb = nn.Embedding(num_puzzle_ids, -(-ndim // d) * d)
            nn.init.zeros_(self.puzzle_emb.weight)
        self.positions = arch.pos_encodings
        if self.positions == "auto":  # a sudoku grid's own positions, else rotary
            self.positions = "sudoku" if seq_len == 81 and not causal else "rope"
        total = seq_len + self.n_prefix
        self.rotary = Rotary(d // arch.n_head, total) if self.positions == "rope" else None
        if self.positions == "learned":
            self.pos = nn.Parameter(lecun_(torch.empty(total, d), fan_in=d))
        elif self.positions == "sudoku":
            if seq_len != 81:
                raise ValueError("pos_encodings=sudoku needs the 81 cells of a sudoku grid")
            self.row, self.col, self.box = (nn.Parameter(lecun_(torch.empty(9, d), fan_in=d)) for _ in range(3))
            # and a learned attention bias per head for each relation between two cells (row, column, box, ...)
            # (at init a cell attends to the 20 cells it shares a row, column or box with, and to itself)
            bias = torch.zeros(arch.n_head, SUDOKU_RELATIONS)
            bias[:, 4] = -4.0
            self.relation_bias = nn.Parameter(bias)
            self.relations = {torch.device("cpu"): sudoku_relations(self.n_prefix)}  # not a buffer: DDP
        self.head = linear(d, n_out)
        self.q_head = nn.Linear(d, 2)  # q_halt, q_continue: zero weights and a negative bias, so it continues at first
        nn.init.zeros_(self.q_head.weight)
        nn.init.constant_(self.q_head.bias, -5.0)
        self.register_buffer("z_init", nn.init.trunc_normal_(torch.empty(self.n_states, d), std=1.0, a=-2, b=2))

    def set_grad_checkpointing(self, on: bool) -> None:
        for m in self.modules():
            if isinstance(m, Level):
                m.grad_checkpointing = on

    def embed_inputs(self, x: torch.Tensor) -> torch.Tensor:
        e = self.embed(x)
        if self.n_prefix:
            prefix = self.puzzle_emb(torch.zeros(x.shape[0], dtype=torch.long, device=x.device))
            prefix = F.pad(prefix, (0, self.n_prefix * self.d - prefix.shape[-1]))
            e = torch.cat([prefix.view(x.shape[0], self.n_prefix, self.d), e], dim=1)
        if self.positions == "learned":
            return 0.707106781 * (self.embed_scale * e + self.pos[: e.shape[1]] * self.embed_scale)
        e = self.embed_scale * e
        if self.positions == "sudoku":
            where = sudoku_positions(self.row, self.col, self.box) * self.embed_scale
            e = e + F.pad(where, (0, 0, self.n_prefix, 0))
        return e

    def initial_states(self, batch: int, length: int) -> tuple[torch.Tensor, ...]:
        return tuple(self.z_init[i].expand(batch, length + self.n_prefix, self.d) for i in range(self.n_states))

    def attention_bias(self, device: torch.device) -> torch.Tensor | None:
        if self.positions != "sudoku":
            return None
        if device not in self.relations:
            self.relations[device] = self.relations[torch.device("cpu")].to(device)
        return self.relation_bias[:, self.relations[device]]

    def reason(self, z: tuple[torch.Tensor, ...], emb: torch.Tensor, pos: dict) -> tuple[torch.Tensor, ...]:
        raise NotImplementedError

    def forward(self, z: tuple[torch.Tensor, ...], x: torch.Tensor):
        """One segment: (new states, detached; logits over the output classes; Q logits (B, 2) in fp32, or fp64 in a
        float64 run)."""
        emb = self.embed_inputs(x)
        pos = {"rope": self.rotary(x.device) if self.rotary is not None else None,
               "bias": self.attention_bias(x.device)}
        z = self.reason(z, emb, pos)
        out = z[0]
        return tuple(s.detach() for s in z), self.head(out[:, self.n_prefix:]), at_least_fp32(self.q_head(out[:, 0]))


class ACT(nn.Module, Pretrained):
    """A recurrent core trained with a carry, deep supervision and adaptive halting (see the module doc)."""

    recurrent = True

    def __init__(self, core: RecurrentCore, arch: ModelArgs, q_continue: bool):
        super().__init__()
        self.core, self.q_continue = core, q_continue
        self.halt_max_steps = arch.halt_max_steps
        self.eval_segments = arch.eval_segments or self.halt_max_steps
        self.exploration = arch.halt_exploration_prob
        self.loss_type = arch.loss_type
        self.family = arch.family
        self.cycles = (arch.H_cycles, arch.L_cycles)

    def set_grad_checkpointing(self, on: bool) -> None:
        self.core.set_grad_checkpointing(on)

    def initial_carry(self, x: torch.Tensor, y: torch.Tensor) -> Carry:
        """Every row halted: the first step takes a fresh example for each."""
        B = x.shape[0]
        return Carry(z=tuple(s.clone() for s in self.core.initial_states(B, x.shape[1])),
                     steps=torch.zeros(B, dtype=torch.long, device=x.device),
                     halted=torch.ones(B, dtype=torch.bool, device=x.device), x=torch.zeros_like(x),
                     y=torch.full_like(y, IGNORE))

    def forward(self, carry: Carry, x: torch.Tensor, y: torch.Tensor):
        """One segment on every row. Halted rows take ``x``/``y`` (a fresh batch) and a reset state.
        Returns (the new carry, logits, Q logits, Q-continue target or None)."""
        h = carry.halted
        init = self.core.initial_states(x.shape[0], x.shape[1])
        z = tuple(torch.where(h.view(-1, 1, 1), i, s) for i, s in zip(init, carry.z))
        steps = torch.where(h, 0, carry.steps)
        cx, cy = torch.where(h.view(-1, 1), x, carry.x), torch.where(h.view(-1, 1), y, carry.y)
        z, logits, q = self.core(z, cx)
        target = None
        with torch.no_grad():
            steps = steps + 1
            last = steps >= self.halt_max_steps
            halted = last
            if self.training and self.halt_max_steps > 1:
                halted = halted | ((q[:, 0] > q[:, 1]) if self.q_continue else (q[:, 0] > 0))
                # drawn in q's type, as the public code's rand_like: float32, except in a float64 run
                explore = torch.rand(q.shape[0], device=q.device, dtype=q.dtype) < self.exploration
                min_steps = torch.randint(2, self.halt_max_steps + 1, steps.shape, device=q.device) * explore
                halted = halted & (steps >= min_steps)
                if self.q_continue:
                    _, _, nq = self.core(z, cx)
                    target = torch.sigmoid(torch.where(last, nq[:, 0], nq.max(dim=-1).values))
        return Carry(z, steps, halted, cx, cy), logits, q, target

    def loss(self, carry: Carry, logits: torch.Tensor, q: torch.Tensor, target: torch.Tensor | None):
        """(loss, metrics): token cross-entropy (mean over each row's targets, then over rows) + 0.5 x the Q
        losses; metrics over the rows that halted at this segment, as tensors (summed over ranks by the caller)."""
        y = carry.y
        mask = y != IGNORE
        counts = mask.sum(-1)
        lm = (per_token_loss(logits, y, self.loss_type).sum(-1) / counts.clamp_min(1)).mean()
        with torch.no_grad():
            right = mask & (logits.argmax(-1) == y)
            solved = right.sum(-1) == counts
        q_halt = F.binary_cross_entropy_with_logits(q[:, 0], solved.to(q.dtype))
        loss = lm + 0.5 * q_halt
        q_cont = torch.zeros((), device=q.device)
        if target is not None:
            q_cont = F.binary_cross_entropy_with_logits(q[:, 1], target)
            loss = loss + 0.5 * q_cont
        with torch.no_grad():
            done = carry.halted & (counts > 0)
            n = done.sum()
            metrics = {"lm_loss": lm.detach(), "q_halt_loss": q_halt.detach(), "q_continue_loss": q_cont.detach(),
                       "halted": n.float(),
                       "accuracy": torch.where(done, right.sum(-1) / counts.clamp_min(1), 0).sum(),
                       "exact_accuracy": (done & solved).sum().float(),
                       "q_halt_accuracy": (done & ((q[:, 0] > 0) == solved)).sum().float(),
                       "steps": torch.where(done, carry.steps, 0).sum().float()}
        return loss, metrics

    def summarize(self, sums: dict, by_rank: dict, per_step: int) -> dict:
        """The training metrics of a log line from ``loss``'s metrics summed over micro-steps and ranks (``sums``;
        ``by_rank``: each rank's sum; ``per_step``: the micro-steps of all ranks): the losses per micro-step, the
        accuracies and ponder per halted row, and each rank's halted rows (they differ between ranks)."""
        halted = max(1.0, sums["halted"])
        out = {k: sums[k] / per_step for k in ("lm_loss", "q_halt_loss", "q_continue_loss")}
        out.update(train_accuracy=sums["accuracy"] / halted, train_exact_accuracy=sums["exact_accuracy"] / halted,
                   q_halt_accuracy=sums["q_halt_accuracy"] / halted, ponder=sums["steps"] / halted)
        # updates of each token's state per example: H_cycles H-updates and H_cycles x L_cycles L-steps a segment
        out["h_updates"] = out["ponder"] * self.cycles[0]
        out["l_steps"] = out["ponder"] * self.cycles[0] * self.cycles[1]
        out["halted_by_rank"] = [int(h) for h in by_rank["halted"]]
        return out

    @torch.no_grad()
    def solve(self, x: torch.Tensor, segments: int | None = None):
        """Evaluation: run ``segments`` (default ``eval_segments``: halt_max_steps unless set) segments from a fresh state.
        Returns the predictions after each segment (S, B, T), the Q logits (S, B, 2) and the last logits."""
        z = tuple(s.clone() for s in self.core.initial_states(x.shape[0], x.shape[1]))
        preds, qs = [], []
        for _ in range(segments or self.eval_segments):
            z, logits, q = self.core(z, x)
            preds.append(logits.argmax(-1))
            qs.append(q)
        return torch.stack(preds), torch.stack(qs), logits

    def halt_index(self, qs: torch.Tensor) -> torch.Tensor:
        """The segment (0-based) at which the Q-head itself would halt each row: the first with q_halt > q_continue
        (TRM: q_halt > 0), else the last."""
        want = (qs[..., 0] > qs[..., 1]) if self.q_continue else (qs[..., 0] > 0)
        want[-1] = True
        return want.float().argmax(dim=0)
