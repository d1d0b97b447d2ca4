"""DiLoCo (Douillard et al. 2023): local steps, then one outer step on the averaged change of the weights.

Every rank trains its own copy with its own (inner) optimizer for H steps without talking to the
others. Then the ranks all-reduce the pseudo-gradient, the shared weights of the last round minus
their own, weighted by the rows each saw, sent as bf16 by default or quantised to int8 or int4 with the
rounding's remainder carried to the next round (``training.diloco.compress``: auralm.parallel.compress);
an outer SGD with Nesterov
momentum (lr 0.7, momentum 0.9 as in the paper) steps the shared weights with it, and every rank
continues from them. One collective per H steps instead of one per step. By default
(``training.diloco.outer_lr=auto``) a run of fewer than FEW_ROUNDS rounds takes the ranks' plain average
instead (lr 1, no momentum: see choose_outer_step).

With ``training.diloco.overlap_steps=K`` the all-reduce of a round travels while every rank takes the
first K local steps of the next (Streaming DiLoCo's overlap, Douillard et al. 2025): the outer step is
taken when it arrives, and each rank's weights become the new shared weights plus the change of its
K steps. The shared weights, the outer momentum and the next pseudo-gradient are as without overlap
except that those K steps started from the older weights. Evaluations and checkpoints finish the
round first, so a resumed run continues exactly.

With rounds by time (``training.diloco.inner_steps=auto``: auralm.parallel.diloco_strategy) the ranks take
unequal, varying numbers of local steps: each weighs its change by the rows it saw in the round
(``start(weight=...)``), and the sum is divided by the sum of the weights; the round's flags carry each rank's
time per local step, from which the next round's length is set.

With ranks that may leave (auralm.training.members: several nodes, training.elastic.min_nodes below their count),
a round whose all-reduce waits for a rank that went silent is sent again among the ranks present, and the outer
step averages over them, weighted by the rows each saw; the others are not restarted.

The NaN guard costs no collective of its own here: a rank skips a local step whose loss or
gradients are not finite, and the counts of such steps travel with the round's small vector of
flags; a pseudo-gradient that is not finite on any rank discards the round on every rank (all go
back to the shared weights of its start).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from auralm.parallel.compress import Wire, record_bytes, slices
from auralm.training.config import DilocoConfig
from auralm.training.distributed import Dist
from auralm.planning.link_budget import AVERAGE, FEW_ROUNDS


PAPER = (0.7, 0.9)  # the paper's outer step: Nesterov SGD, lr 0.7, momentum 0.9 (link_budget.PAPER_STEP)
PLAIN = (1.0, 0.0)  # the ranks' plain average (weighted by rows): lr 1, no momentum (link_budget.AVERAGE)


def choose_outer_step(cfg: DilocoConfig, max_steps: int) -> str:
    """Set what ``training.diloco.outer_lr``/``outer_momentum`` left at auto (None), in place; the log's phrase
    saying what the outer step is and why.

    Both auto: by the run's length, the paper's step for FEW_ROUNDS rounds or more, else the plain average, which
    on our measured short runs (docs/lowcomm.md, 2 ranks, ``model=small``, H=8) ended 1.7% above DDP's validation
    loss after 6 rounds where the paper's ended 5.4% above it (1.4% against 7.1% after 18). One of them given: the
    other from the step it belongs to (a momentum of 0: the average's lr 1; else the paper's). Explicit values are
    kept as given."""
    rounds = max_steps // cfg.inner_steps
    lr, momentum = cfg.outer_lr, cfg.outer_momentum
    if lr is None and momentum is None:
        few = rounds < FEW_ROUNDS
        lr, momentum = PLAIN if few else PAPER
        why = (f"chosen by training.diloco.outer_lr=auto for {rounds} round(s) of {cfg.inner_steps} local steps "
               f"({'fewer than' if few else 'at least'} {FEW_ROUNDS}" +
               (f": on 6 rounds the average ended 1.7% above DDP's val loss, the paper's step 5.4%, docs/lowcomm.md; "
                f"the paper's step: training.diloco.outer_lr={PAPER[0]:g} training.diloco.outer_momentum="
                f"{PAPER[1]:g})" if few else ")"))
    elif lr is None:
        lr = PLAIN[0] if momentum == 0 else PAPER[0]
        why = (f"the given training.diloco.outer_momentum={momentum:g} with the "
               f"{'average' if momentum == 0 else 'paper'}'s lr (outer_lr=auto)")
    elif momentum is None:
        momentum = PAPER[1]
        why = f"the given training.diloco.outer_lr={lr:g} with the paper's momentum (outer_momentum=auto)"
    else:
        why = "as given"
    cfg.outer_lr, cfg.outer_momentum = lr, momentum
    what = "the ranks' plain average" if (lr, momentum) == PLAIN else \
        "the paper's Nesterov SGD" if (lr, momentum) == PAPER else "Nesterov SGD" if momentum else "SGD"
    return f"outer step: {what} (lr {lr:g}, momentum {momentum:g}), {why}"


def few_rounds_note(cfg: DilocoConfig, max_steps: int) -> str | None:
    """A warning for a run of fewer than FEW_ROUNDS rounds with an outer step with momentum (given by the user:
    auto takes the plain average there), else None. Call after ``choose_outer_step``.

    Measured on two lab nodes (docs/lowcomm.md, ``model=small``, H=8): the paper's outer step (lr 0.7, Nesterov
    0.9) ended 5.4% above DDP's validation loss after 6 rounds and 7.1% after 18, where the plain average of the
    ranks' weights (outer lr 1, no momentum) ended 1.8% and 1.4% above it. Longer runs were not measured; the
    paper's have thousands of rounds, with 8 workers."""
    rounds = max_steps // cfg.inner_steps
    if not cfg.outer_momentum or rounds >= FEW_ROUNDS:
        return None
    return (f"warning: diloco: {rounds} round(s) of {cfg.inner_steps} local steps with an outer step with momentum "
            f"(lr {cfg.outer_lr:g}, momentum {cfg.outer_momentum:g}): on runs of 6 and 18 rounds it ended 5.4% and "
            f"7.1% above DDP's val loss, the plain average of the ranks' weights 1.8% and 1.4%; to average instead: "
            f"{' '.join(AVERAGE)}, or leave both at auto (the default: the average below {FEW_ROUNDS} rounds; "
            f"docs/lowcomm.md)")


@dataclass
class Round:
    ok: bool  # every rank's pseudo-gradient was finite and the outer step was taken
    loss: float  # the mean local loss of the round over all ranks, weighted by rows (nan if none)
    bad_steps: list[int]  # local steps skipped by the guard in this round, per rank
    broken: list[int]  # ranks whose pseudo-gradient was not finite
    end: int  # the training step the round ended at (as ``start`` was told)
    step_s: list[float]  # each rank's seconds per local step in the round (0: not timed, or not present)
    weights: list[float]  # each rank's weight in the round's average (its rows, with rounds by time)


@dataclass
class _InFlight:
    works: list  # the two collectives, to wait for
    payload: torch.Tensor | tuple  # the pseudo-gradients summed on arrival; int8, int4: (every rank's records of
    #                                this rank's blocks, the ranks' slices of the blocks, this rank's place in them)
    dtype: torch.dtype  # the weights' type (payload's may be bf16 or codes)
    flags: torch.Tensor
    at_start: list[torch.Tensor] | None  # the rank's weights when it sent them, when it steps on meanwhile
    end: int
    sent: tuple[torch.Tensor, torch.Tensor] | None = None  # what was sent, to send again if a rank leaves
    epoch: int = 0  # the membership it was sent in


class DiLoCo:
    def __init__(self, model: torch.nn.Module | list[torch.Tensor], cfg: DilocoConfig, d: Dist, weight: float,
                 varying: bool = False):
        """``model``: the model, or the parameters it synchronises (a fragment's)."""
        if cfg.outer_lr is None or cfg.outer_momentum is None:  # a caller's mistake, not the user's
            raise ValueError("DiLoCo: the outer step is still auto: call choose_outer_step(cfg, max_steps) first")
        self.d, self.weight, self.cfg = d, weight, cfg
        self.varying = varying  # the weights change from round to round (rounds by time): the sum is divided by theirs
        params = model.parameters() if isinstance(model, torch.nn.Module) else model
        self.params = [p for p in params if p.requires_grad]
        self.shared = [p.detach().clone() for p in self.params]  # the weights every rank agreed on last
        self.outer = torch.optim.SGD(self.shared, lr=cfg.outer_lr, momentum=cfg.outer_momentum,
                               nesterov=cfg.outer_momentum > 0)
        self.wire = Wire(cfg.compress, sum(p.numel() for p in self.params))
        self.sent_bytes = 0  # what this rank sent, all rounds (an all-reduce: a ring's share; a resend counted again)
        self.round_bytes = 0  # what it sent for the last round finished
        self._round_from = 0
        self.in_flight: _InFlight | None = None  # a round sent and not yet finished (overlap)

    @torch.no_grad()
    def start(self, bad_steps: int, loss_sum: float, losses: int, *, carry: bool = True, end: int = 0,
              step_s: float = 0.0) -> None:
        """End a round: send this round's pseudo-gradient and flags; ``finish`` waits for them and takes the
        outer step (right after, without overlap). ``step_s``: this rank's seconds per local step in the round.
        With ``carry`` the rank may take local steps in between (overlap: Streaming DiLoCo's, Douillard et
        al. 2025): ``finish`` puts them on top of the new shared weights, so no step is lost."""
        d = self.d
        delta = torch.cat([(s - p).reshape(-1) for s, p in zip(self.shared, self.params)])
        finite = bool(torch.isfinite(delta).all())
        flags = torch.zeros(4 * d.world + 3, dtype=torch.float64)
        flags[d.rank] = bad_steps
        flags[d.world + d.rank] = 0.0 if finite else 1.0
        flags[2 * d.world + d.rank] = step_s
        flags[3 * d.world + d.rank] = self.weight  # the weights of the ranks present sum to 1 until one leaves
        flags[-3] = end  # summed: every rank present must have sent the same round (checked in finish)
        if losses:
            flags[-2], flags[-1] = self.weight * loss_sum / losses, self.weight
        payload = self.wire.encode(delta * self.weight if finite else torch.zeros_like(delta))
        self._round_from = self.sent_bytes
        sent = (payload.clone(), flags.clone()) if d.members is not None else None  # to send again if a rank leaves
        works, received = self._send(payload, flags)
        self.in_flight = _InFlight(works, received, delta.dtype, flags,
                                   [p.detach().clone() for p in self.params] if carry else None, end, sent, d.epoch)

    def _send(self, payload: torch.Tensor, flags: torch.Tensor) -> tuple[list, torch.Tensor | tuple]:
        """The collectives of a round, and where the payload arrives: summed in place (an all-reduce), or, int8 and
        int4, the first half of a reduce-scatter and all-gather: each present rank's records of the blocks this rank
        owns (an all-to-all)."""
        d = self.d
        if not self.wire.summed:
            present = list(d.members.present) if d.members is not None else list(range(d.world))
            bounds, me = slices(len(payload), len(present)), present.index(d.rank)
            if d.world == 1:
                return [], (payload, bounds, me)
            (start, end), rec = bounds[me], record_bytes(self.wire.kind)
            received = torch.empty(len(present) * (end - start), rec, dtype=torch.uint8, device=payload.device)
            self.sent_bytes += payload.numel() - (end - start) * rec
            work = dist.all_to_all_single(received.view(-1), payload.view(-1), [(end - start) * rec] * len(present),
                                          [(b - a) * rec for a, b in bounds], group=d.group_for(payload), async_op=True)
            return [work, dist.all_reduce(flags, group=d.objects_group, async_op=True)], (received, bounds, me)
        if d.world == 1:
            return [], payload
        k = d.present_count
        self.sent_bytes += round(2 * (k - 1) / k * payload.numel() * payload.element_size())  # a ring's
        work = dist.all_reduce(payload, group=d.group_for(payload), async_op=True)
        return [work, dist.all_reduce(flags, group=d.objects_group, async_op=True)], payload

    def _gather(self, sent: _InFlight) -> torch.Tensor | None:
        """int8, int4: the second half, once every rank's records of this rank's blocks are here: their sum,
        quantised again and all-gathered; the fp32 average of every block. None when a rank left meanwhile (the
        round is sent again among the ranks present)."""
        d, wire = self.d, self.wire
        received, bounds, me = sent.payload
        start, end = bounds[me]
        data, left_out = wire.reduce(list(received.view(len(bounds), end - start, -1)))
        if d.world == 1:
            parts = [data]
        else:
            width = max(b - a for a, b in bounds)
            padded = torch.zeros(width, data.shape[1], dtype=torch.uint8, device=data.device)
            padded[:end - start] = data
            gathered = [torch.empty_like(padded) for _ in bounds]
            epoch = d.epoch
            self.sent_bytes += padded.numel() * (len(bounds) - 1)
            if not d.wait([dist.all_gather(gathered, padded, group=d.group_for(padded), async_op=True)], epoch):
                return None
            parts = [g[:b - a] for g, (a, b) in zip(gathered, bounds)]
        wire.keep(left_out, start)
        return wire.decode(parts)

    def _wait(self, sent: _InFlight, again: bool = False) -> None:
        """The round's collectives (``again``: sent once more, first); sent again among the ranks present whenever
        one leaves meanwhile."""
        while again or not self.d.wait(sent.works, sent.epoch):
            sent.flags = sent.sent[1].clone()
            sent.works, sent.payload = self._send(sent.sent[0].clone(), sent.flags)
            sent.epoch, again = self.d.epoch, False

    @torch.no_grad()
    def finish(self) -> Round:
        """Wait for the round ``start`` sent, take the outer step, and move every rank to the new shared weights
        (plus, when it carries them, the local steps it took since ``start``)."""
        d, sent = self.d, self.in_flight
        self.in_flight = None
        self._wait(sent)
        while True:
            flags = sent.flags
            if flags[-3] != sent.end * d.present_count:  # a world of one: its own round, unsent
                raise RuntimeError(
                    f"rank {d.rank}: the ranks present sent different rounds (this one ends at step {sent.end}; their "
                    f"steps sum to {flags[-3]:g} over {d.present_count} ranks): a rank left during the last moments "
                    "of a collective, and averaging them would be wrong; the run stops here (resume=latest goes on "
                    "from the last checkpoint)")
            counts = [int(v) for v in flags[:d.world].tolist()]
            broken = [r for r in range(d.world) if flags[d.world + r] > 0]
            loss = float(flags[-2] / flags[-1]) if flags[-1] > 0 else float("nan")
            step_s, weights = flags[2 * d.world: 3 * d.world].tolist(), flags[3 * d.world: 4 * d.world].tolist()
            if broken:
                self.wire.undo()
                self.discard()  # the local steps since start go too: every rank back to the round's start
                return Round(False, loss, counts, broken, sent.end, step_s, weights)
            averaged = self.wire.decode(sent.payload) if self.wire.summed else self._gather(sent)
            if averaged is not None:
                break
            self._wait(sent, again=True)  # a rank left during the all-gather: the round again among those present
        if sent.at_start is not None:  # the local steps since start: kept as a change, put back below
            for p, began in zip(self.params, sent.at_start):
                p.sub_(began)
        self.round_bytes = self.sent_bytes - self._round_from
        averaged = averaged.to(sent.dtype)
        if self.varying or d.members is not None and d.members.changed:  # the weights of the ranks present do not
            averaged /= sum(weights)  # sum to 1
        offset = 0
        for s in self.shared:
            s.grad = averaged[offset: offset + s.numel()].view_as(s)
            offset += s.numel()
        self.outer.step()
        for s in self.shared:
            s.grad = None
        if sent.at_start is None:
            self.discard()  # every rank continues from the new shared weights
        else:
            for s, p in zip(self.shared, self.params):
                p.add_(s)
        return Round(True, loss, counts, [], sent.end, step_s, weights)

    @torch.no_grad()
    def discard(self) -> None:
        """Every rank's weights back to the shared ones (after the outer step, or instead of it)."""
        for s, p in zip(self.shared, self.params):
            p.copy_(s)

    @torch.no_grad()
    def restart_from_model(self) -> None:
        """The shared weights become the model's (after the guard restored them); the outer momentum restarts."""
        for s, p in zip(self.shared, self.params):
            s.copy_(p)
        self.outer.state.clear()
        self.wire.reset()

    def state_dict(self) -> dict:
        """The outer optimizer's state, every rank's (a rank's own remainder: ``wire.state_dict``, per rank)."""
        return {"outer": self.outer.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        """After the model holds the checkpoint's (shared) weights."""
        self.restart_from_model()
        self.outer.load_state_dict(state["outer"])
        for group in self.outer.param_groups:  # this run's outer step (the checkpoint's may differ: auto, another
            group.update(lr=self.cfg.outer_lr, momentum=self.cfg.outer_momentum,  # length), its momentum kept
                         nesterov=self.cfg.outer_momentum > 0)
