"""``training.sync=diloco``: rounds of local steps on every rank, then the outer step on the averaged change of
the weights (the algorithm is auralm.parallel.diloco; this is its place in the trainer).

A round is ``training.diloco.inner_steps`` single-process steps (each rank its share of them), each checked by the
NaN guard locally; the round's outer step waits for the all-reduce (with ``overlap_steps``, during the next
round's first local steps). An evaluation or a checkpoint finishes the round in flight first (``finish_pending``).
The EMA follows the rounds. Imports torch, auralm.parallel's single, diloco, strategy and the loop parts.

Fragments (``training.diloco.fragments=P``, Streaming DiLoCo's, Douillard et al. 2025): the weights are cut into P
parts of about equal size (consecutive parameters), each with its own shared copy, outer optimizer and wire; part p is
synchronised once a round, after about (p + 1)/P of the round's local steps (by time, with rounds by time), so the
link carries a P-th of the model at a time, at staggered points, and with ``overlap_steps`` each part's all-reduce
travels during the next K local steps. An evaluation or a checkpoint synchronises the parts that took local steps
since their point (a P-th of the model each), so that every rank holds the shared weights there, and a resumed run
goes on exactly. P=1 is DiLoCo's round.

Rounds by time (``training.diloco.inner_steps=auto``, stored as ``timed``): a round lasts what the fastest rank
present took for H local steps in the last round (its seconds per step, sent with the round's flags, times H), and
every rank takes the local steps it can in it: it starts another while the round's end is more than half a step
of its own away, at least one and at most 2H. A rank that slows down mid-run (a laptop's other work, a throttled
CPU) then costs only its own share: the others do not wait for its H steps, at most for the step it is in. The
outer average weighs each rank's change by the rows it saw in the round. The first round, with nothing measured
yet, takes the shares' steps (``training.balance``). The schedule counts H steps a round, as with fixed rounds; a
resumed run goes on from the checkpoint's round, not step for step as the uninterrupted run would (the steps a
rank takes depend on the time).
"""

from __future__ import annotations

import math
import os
import sys
import time

import torch

from auralm.data import datadir
from auralm.errors import UserError
from auralm.training import distributed
from auralm.training.members import BROKEN_LOST_S, Membership
from auralm.parallel.compress import BLOCK, sent_per_round
from auralm.parallel.diloco import DiLoCo, choose_outer_step, few_rounds_note
from auralm.planning.link_budget import human_bytes
from auralm.parallel.single import Single
from auralm.parallel.strategy import Training


class DiLoCoRounds(Single):
    name = "diloco"
    several_ranks = True
    per_step_ema = False
    waits = "every DiLoCo round waits for the slowest"

    def inner_steps(self) -> int | None:
        return self.steps_a_round(self.t)

    @classmethod
    def steps_a_round(cls, training) -> int | None:
        return training.diloco.inner_steps

    def attach(self, training: Training, ckpt, loop_step) -> None:
        """The outer step (auto: by the run's length, set in the config the run records); its checkpoint parts (the
        outer optimizers' shared state, each rank's inner optimizer and rounding remainder), restored on a resume."""
        super().attach(training, ckpt, loop_step)
        t = self.t
        self.outer_step = choose_outer_step(t.diloco, t.max_steps)
        weight = training.shares.sample_weight(self.d.rank)
        self.outers = [DiLoCo(part, t.diloco, self.d, weight, varying=t.diloco.timed)
                       for part in fragments([q for q in training.model.parameters() if q.requires_grad],
                                             t.diloco.fragments)]
        self.round_s = None  # rounds by time: the next round's length for H steps (None: not measured yet)
        self.local_steps = 0  # this rank's local steps since the start (a part in flight is finished K after its own)
        self.started = [0] * len(self.outers)  # local_steps when each part was last sent
        self.broken: list[int] = []  # ranks whose change of a part was not finite, this round
        ckpt.register("diloco", get=self.outer_state, put=self.load_outer_state)
        ckpt.register("inner_optimizer", training.optimizer, per_rank=True)
        if not self.outer.wire.summed:  # what each rank's rounding left out, for an exact resume
            ckpt.register("diloco_remainder", get=self.remainder_state, put=self.load_remainder, per_rank=True)
        self.own_metrics = distributed.Dist(device=self.d.device)  # the metrics are this rank's: no collective in a round
        nodes = int(os.environ.get("GROUP_WORLD_SIZE", "1"))  # torchrun's node count
        if self.d.world > 1 and nodes > 1 and (t.elastic.min_nodes or 1) < nodes:  # a node may leave: the others go on
            self.d.members = Membership(self.d.rank, self.d.world)
            if self.d.group is not None:
                self.d.members.nccl_group = self.d.group
        self.seen_epoch, self.base_accum, self.own_stream = 0, t.grad_accum, None
        self.nominal_accum = t.grad_accum * t.diloco.inner_steps * self.d.world  # micro-batches of a nominal round
        self.round_steps: list[int] = []

    @property
    def outer(self) -> DiLoCo:
        """The last part's (the whole model's with one part): it carries the round's flags, loss and timing."""
        return self.outers[-1]

    def say_start(self, log, step: int) -> None:
        t = self.t
        wire = self.outer.wire
        numel = sum(o.wire.numel for o in self.outers)
        sent = "all-reduced as " + ("fp32" if wire.kind == "none" else wire.kind) if wire.summed else \
            (f"quantised to {wire.kind} (blocks of {BLOCK}, the rounding's remainder carried to the next round) and "
             "reduce-scattered and all-gathered as codes")
        steps = (f"rounds by time (training.diloco.inner_steps=auto: each as long as the fastest rank's last "
                 f"{t.diloco.inner_steps} local steps, every rank taking the steps it can in it, weighted by its rows)"
                 if t.diloco.timed else f"{t.diloco.inner_steps} local steps a round")
        per_round, parts, k = sent_per_round(wire.kind, numel, self.d.world), len(self.outers), t.diloco.overlap_steps
        split = (f" in {parts} parts of about {human_bytes(per_round / parts)}, each sent after its share of the "
                 f"round's local steps" if parts > 1 else "")
        overlap = "" if not k else f"; each part's all-reduce overlaps the next {k} local steps" if parts > 1 else \
            f"; each round's all-reduce overlaps the next round's first {k} local steps"
        log.say(f"sync: diloco, {steps}, the change of the weights {sent}: {human_bytes(per_round)} sent by each rank "
                f"a round ({human_bytes(sent_per_round('bf16', numel, self.d.world))} as bf16){split}, "
                f"{self.outer_step}{overlap}")
        if len(self.outers) < t.diloco.fragments:
            log.say(f"diloco: training.diloco.fragments={t.diloco.fragments}, but the model has "
                    f"{len(self.outers)} parameter tensors: {len(self.outers)} parts")
        if self.d.members is not None:
            log.say(f"diloco: a rank silent for {self.d.members.lost_s:g}s ({BROKEN_LOST_S:g}s once a collective with it "
                    f"failed) leaves the run at its round's all-reduce; the others go on without it, not restarted "
                    f"(training.elastic.min_nodes)")
        note = few_rounds_note(t.diloco, t.max_steps)
        if note:
            log.event(step, "diloco_few_rounds", note, rounds=t.max_steps // t.diloco.inner_steps)

    def batches(self, rank: int | None = None):
        """Every rank its own batches of training.batch_size, from its own position (unequal shares and rounds by time:
        the ranks take different numbers of local steps)."""
        p, t, d = self.p, self.t, self.d
        if p.shares.equal:
            return super().batches(rank)  # the same batches (each rank's slice of every global batch)
        return datadir.batches(p.train_set, t.batch_size, d.rank if rank is None else rank, d.world, t.seed,
                            start=p.position, augment=self.augment)

    def finish_round(self, part: int = -1) -> float:
        """The outer step of a part in flight; after the last part's (the round's), what follows a round: the EMA,
        the guard's verdict."""
        p = self.p
        rnd = self.outers[part].finish()
        self.broken = sorted(set(self.broken) | set(rnd.broken))
        if self.d.members is not None and self.d.members.epoch != self.seen_epoch:
            self.keep_rows()
        if part not in (-1, len(self.outers) - 1):
            return rnd.loss
        end, broken, self.broken = rnd.end, self.broken, []
        if self.t.diloco.timed:
            self.time_rounds(rnd)
        ok = rnd.ok and not broken
        if p.ema and ok:
            p.ema.update()
        if p.guard:
            p.guard.after_round(end, rnd.bad_steps, broken, learned=ok and math.isfinite(rnd.loss))
            if p.guard.after_step(end, ok and not any(rnd.bad_steps)):  # no snapshot of a round with skips
                for outer in self.outers:  # rank 0's restored weights are every rank's shared weights now
                    outer.restart_from_model()
        return rnd.loss

    def time_rounds(self, rnd) -> None:
        """Rounds by time: the next round's length (H of the fastest rank's last steps), this rank's part of the
        samples counted, and each rank's local steps in the round for the step's record."""
        timed = [s for s in rnd.step_s if s > 0]
        if timed:
            self.round_s = self.t.diloco.inner_steps * min(timed)
        total = sum(rnd.weights)
        if total > 0 and self.outer.weight > 0:  # every rank's rows per row of this one, as last round
            self.loop_step.samples_factor = total / self.outer.weight
        self.round_steps = [round(w * self.nominal_accum / self.base_accum) for w in rnd.weights]

    def keep_rows(self) -> None:
        """After ranks left: the ranks present take over their rows. Each absent rank's batches go to one rank present
        (in turn), which takes them beside its own, training.grad_accum micro-batches of each a local step, from the
        same position: a round sees the rows it would have seen with every rank, and the ranks' positions stay those
        of the whole world (a rank that rejoins starts where it would have been). Its part of the outer average grows
        by theirs."""
        m, t, d, steps = self.d.members, self.t, self.d, self.loop_step
        self.seen_epoch = m.epoch
        absent = [r for r in range(d.world) if r not in m.present]
        taken = [a for i, a in enumerate(absent) if m.present[i % len(m.present)] == d.rank]
        if self.own_stream is None:
            self.own_stream = steps.stream
        steps.sources = 1 + len(taken)
        steps.stream = _in_turn([self.own_stream, *(self.batches(a) for a in taken)], self.base_accum)
        t.grad_accum = self.base_accum * steps.sources
        for outer in self.outers:  # the rows it sees, of a whole round's
            outer.weight = self.p.shares.sample_weight(d.rank) * steps.sources
        steps.samples_factor = self.p.shares.global_factor(d.rank) / steps.sources
        if taken:  # the first rank present always takes one
            print(f"diloco: {len(m.present)} of {d.world} ranks present: rank {d.rank} takes rank(s) "
                  f"{', '.join(map(str, taken))}'s rows beside its own ({t.grad_accum} micro-batches a local step), "
                  f"so that a round sees the rows it would have", file=sys.stderr, flush=True)

    def advance(self, loop_step) -> tuple[int, float, torch.Tensor]:
        """H of the loop's steps (``loop_step``, auralm.training.step.TrainStep), local to each rank (its share of
        them), then the outer step on the averaged change; with overlap, each part's outer step once the next
        ``overlap_steps`` local steps are taken; with fragments, part p sent after about (p + 1)/P of the round (a part
        in flight is finished before the next is sent, so every rank's collectives come in the same order)."""
        p, t = self.p, self.t
        length = min(t.diloco.inner_steps, t.max_steps - p.step)
        mine = p.shares.inner_steps_for(self.d.rank, length, t.diloco.inner_steps)
        began = time.monotonic()
        deadline = None if self.round_s is None else began + self.round_s * length / t.diloco.inner_steps
        end, parts = p.step + length, len(self.outers)
        bad, loss_sum, losses, norm, j, sent = 0, 0.0, 0, torch.zeros(()), 0, 0
        while self.another(j, mine, length, began, deadline):
            self.finish_due()
            # where this local step stands in the schedule
            at = p.step + (min(j + 1, length) if t.diloco.timed else math.ceil((j + 1) * length / mine))
            loss, norm = loop_step.local(at)
            ok = p.guard.finite(loss, norm) if p.guard else True
            if ok:
                loss_sum, losses = loss_sum + float(loss), losses + 1
            bad += not ok
            loop_step.apply(ok)
            j, self.local_steps = j + 1, self.local_steps + 1
            while sent < parts - 1 and self.part_due(sent, j, mine, began, deadline):  # the last: at the round's end
                self.send(sent, end)
                sent += 1
        while sent < parts - 1:  # a rank of few local steps: its parts still due, in order
            self.send(sent, end)
            sent += 1
        step_s = 0.0
        if t.diloco.timed:
            step_s = (time.monotonic() - began) / j
        self.send(parts - 1, end, bad, loss_sum, losses, step_s)
        if not t.diloco.overlap_steps:
            return end, self.finish_round(), norm
        # overlap: the round's loss over all ranks arrives later (an evaluation or checkpoint waits for it); until
        # then the log shows this rank's own
        return end, loss_sum / losses if losses else float("nan"), norm

    def part_due(self, part: int, j: int, mine: int, began: float, deadline: float | None) -> bool:
        """Whether part ``part`` (not the last) is due after local step ``j`` (from 1): after (part + 1)/P of the
        round's local steps, or of its time with rounds by time."""
        share = (part + 1) / len(self.outers)
        if deadline is None:
            return j >= math.ceil(share * mine)
        return time.monotonic() >= began + share * (deadline - began)

    def send(self, part: int, end: int, bad: int = 0, loss_sum: float = 0.0, losses: int = 0,
             step_s: float = 0.0) -> None:
        """Send a part's change (the last part's with the round's flags); without overlap, its outer step now."""
        t, outer = self.t, self.outers[part]
        for q, other in enumerate(self.outers):  # the part in flight finished first (fewer local steps than
            if other.in_flight:  # overlap_steps since it was sent): every rank's collectives in the same order
                self.finish_round(q)
        if t.diloco.timed:  # this rank's part of the average: the rows it saw since the part was last sent
            outer.weight = (self.local_steps - self.started[part]) * t.grad_accum / self.nominal_accum
        self.started[part] = self.local_steps
        outer.start(bad, loss_sum, losses, carry=t.diloco.overlap_steps > 0, end=end, step_s=step_s)
        if not t.diloco.overlap_steps and part != len(self.outers) - 1:
            self.finish_round(part)

    def finish_due(self) -> None:
        """Before a local step: the parts whose all-reduce has had its ``overlap_steps`` local steps to travel."""
        k = self.t.diloco.overlap_steps
        for part, outer in enumerate(self.outers):
            if outer.in_flight and self.local_steps - self.started[part] >= k:
                self.finish_round(part)

    def another(self, j: int, mine: int, length: int, began: float, deadline: float | None) -> bool:
        """Whether to take local step ``j`` (from 0) of this round: fixed rounds, until this rank's share of them;
        rounds by time, while the round's end is more than half a step of this rank's away (at least one step, at
        most 2H)."""
        if deadline is None or j == 0:
            return j < mine
        per_step = (time.monotonic() - began) / j
        return j < 2 * length and time.monotonic() + per_step / 2 < deadline

    def finish_pending(self, loss: float) -> float:
        """Both an evaluation and a checkpoint see, and a resume starts from, the shared weights: the parts in flight
        finished, and (fragments) the parts that took local steps since they were sent, sent and finished now."""
        last = len(self.outers) - 1
        for part, outer in enumerate(self.outers):  # at most one in flight
            if outer.in_flight:
                finished = self.finish_round(part)
                loss = finished if part == last else loss
        for part, outer in enumerate(self.outers[:-1]):
            if self.local_steps > self.started[part]:
                self.send(part, self.p.step)
                if outer.in_flight:
                    self.finish_round(part)
        return loss

    def meter_group(self) -> distributed.Dist:
        return self.own_metrics

    def wire_figures(self) -> dict:
        figures = {"round_bytes": sum(o.round_bytes for o in self.outers),
                   "sent_bytes": sum(o.sent_bytes for o in self.outers)}
        if self.t.diloco.timed and self.round_steps:
            figures["round_steps"] = self.round_steps  # each rank's local steps in the last round
        return figures

    def outer_state(self) -> dict:
        if len(self.outers) == 1:
            return self.outer.state_dict()
        return {"fragments": [o.state_dict() for o in self.outers]}

    def load_outer_state(self, saved: dict) -> None:
        states = saved.get("fragments", [saved])
        if len(states) != len(self.outers):
            raise UserError(f"the checkpoint's DiLoCo state is in {len(states)} part(s) and this run's in "
                            f"{len(self.outers)} (training.diloco.fragments): resume with "
                            f"training.diloco.fragments={len(states)}")
        for outer, state in zip(self.outers, states):
            outer.load_state_dict(state)

    def remainder_state(self):
        remainder = [o.wire.state_dict() for o in self.outers]
        return remainder if len(remainder) > 1 else remainder[0]

    def load_remainder(self, saved) -> None:
        for outer, state in zip(self.outers, saved if isinstance(saved, list) else [saved]):
            outer.wire.load_state_dict(state)

    @classmethod
    def link_cost(cls, budget: dict, hook: str) -> dict | None:
        return None  # one all-reduce a round, not a step: the budget's "diloco" entry, which the suggestion reads


def fragments(params: list, count: int) -> list[list]:
    """``params`` cut into ``count`` runs of consecutive tensors of about equal size (fewer when there are fewer
    tensors): a part ends once its elements reach its share of the whole."""
    count = max(1, min(count, len(params)))
    total, parts, current, seen = sum(q.numel() for q in params), [], [], 0
    for i, q in enumerate(params):
        current.append(q)
        seen += q.numel()
        left_parts, left_tensors = count - len(parts) - 1, len(params) - i - 1
        if left_parts and (seen >= total * (len(parts) + 1) / count or left_tensors == left_parts):
            parts.append(current)
            current = []
    return parts + [current]


def _in_turn(streams: list, each: int):
    """Batches from each stream in turn, ``each`` at a time: a local step's micro-batches, every rank's share."""
    while True:
        for stream in streams:
            for _ in range(each):
                yield next(stream)
