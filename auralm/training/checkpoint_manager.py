"""A run's checkpoints as a set of stateful parts: each part registers once, by name, saying whether every rank keeps
its own; the manager saves them all together and, on a resume, hands each part its state as it registers.

What a checkpoint holds (auralm.training.checkpoint writes the files; the strategy chooses how: rank 0 the whole model,
or every rank its shards):

- the model's weights and the optimizer's state;
- every rank's random state (restored when the world has the same size);
- the registered parts: a per-rank part (the ACT carries, DiLoCo's inner optimizer, PowerSGD's error feedback) as a
  list in rank order, a shared part (the EMA, DiLoCo's outer optimizer, the fp16 scaler) as rank 0's, each in an
  extra file named after it; a part registered ``in_state`` (the NaN guard's small JSON state) in state.json instead;
- state.json: the trainer's run state (its step, data positions, figures), the config, and which extras are per rank.

A part is any object with ``state_dict()`` and ``load_state_dict(state)``, or a pair of functions. It may register
before the resume (then it is loaded there) or after it, when it comes into existence (the strategy's parts, made as it
attaches): the checkpoint's entry is handed to it then. A per-rank part of a checkpoint written by a world of another
size is not handed to anyone: the part keeps its fresh state, as the random states do.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from auralm.errors import UserError
from auralm.training import checkpoint, distributed
from auralm.training.precision import rng_state, set_rng_state


@dataclass
class Part:
    name: str
    get: Callable[[], Any]  # its state, to save (a per-rank part's: on every rank; a shared one's: on rank 0)
    put: Callable[[Any], None]  # its saved state, on a resume
    per_rank: bool = False
    in_state: bool = False  # kept in state.json (small, JSON) rather than in an extra file
    missing: Callable[[], None] | None = None  # on a resume from a checkpoint that kept none of it


def per_rank_extras(state: dict, extras: dict) -> set[str]:
    """The extras of a checkpoint kept per rank, as its state.json names them; a checkpoint written before it named
    them: the lists among them (the shared ones are dicts)."""
    named = state.get("per_rank_extras")
    return set(named) if named is not None else {k for k, v in extras.items() if isinstance(v, list)}


class CheckpointManager:
    """The checkpoints of one run, for rank ``d``: the weights of ``model`` and ``optimizer`` written by the strategy
    ``s`` into ``run_dir``, and the parts registered with it."""

    def __init__(self, d: distributed.Dist, s, run_dir: Path | None, model, optimizer):
        self.d, self.s, self.run_dir, self.model, self.optimizer = d, s, run_dir, model, optimizer
        self.parts: dict[str, Part] = {}
        self.state: dict | None = None  # the resumed checkpoint's state.json (None: a fresh run)
        self.saved: dict[str, Any] = {}  # the resumed checkpoint's parts not yet handed to a registered part

    # ------------------------------------------------------------ the parts

    def register(self, name: str, part: Any = None, *, get: Callable[[], Any] | None = None,
                 put: Callable[[Any], None] | None = None, per_rank: bool = False, in_state: bool = False,
                 missing: Callable[[], None] | None = None) -> None:
        """Save ``part`` (its ``state_dict``/``load_state_dict``, or ``get`` and ``put``) with every checkpoint under
        ``name``; after a resume, it gets the checkpoint's state now (or ``missing()`` when the checkpoint had none)."""
        if name in self.parts:
            raise ValueError(f"checkpoint part {name!r} is registered twice")
        self.parts[name] = Part(name, get or part.state_dict, put or part.load_state_dict, per_rank, in_state,
                                missing)
        if self.state is not None:
            self._hand(self.parts[name])

    def _hand(self, part: Part) -> None:
        if part.name in self.saved:
            part.put(self.saved.pop(part.name))
        elif part.missing and not part.per_rank:
            part.missing()

    # ------------------------------------------------------------ saving

    def save(self, step: int, run_state: dict, config: dict) -> Path | None:
        """A checkpoint of ``step``: the parts, the random states, and (rank 0's) ``run_state`` and ``config`` in
        state.json; written as the strategy writes. Every rank calls it (the per-rank parts are gathered). The path,
        on rank 0."""
        d = self.d
        rng = distributed.gather_object(d, rng_state(d.device))
        per_rank = {p.name: distributed.gather_object(d, p.get()) for p in self.parts.values() if p.per_rank}
        extra = state = None
        if d.rank == 0:
            shared = {p.name: p.get() for p in self.parts.values() if not p.per_rank}
            state = {**run_state, **{k: v for k, v in shared.items() if self.parts[k].in_state},
                     "per_rank_extras": sorted(per_rank), "config": config}
            extra = {**per_rank, **{k: v for k, v in shared.items() if not self.parts[k].in_state}}
        return self.s.save(self.run_dir, step, rng, state, extra)

    # ------------------------------------------------------------ resuming

    def resume(self, found: list[Path], log, fits: Callable[[Path, dict], None]) -> dict | None:
        """Rank 0 loads the newest whole checkpoint of ``found`` (``fits(ckpt, state)`` raises UserError when it is
        for another model) and gives every rank its weights; each rank gets its own entry of the per-rank parts (when
        the world is the same size) and its random state. The parts registered so far are loaded; the rest as they
        register. The checkpoint's state.json on every rank, or None: nothing to resume."""
        d, sharded = self.d, self.s.sharded_checkpoints
        state = rng = error = chosen = None
        extras: dict = {}
        if d.rank == 0:
            try:
                state, rng, chosen, extras = self._load_newest(found, log, fits, sharded)
            except UserError as e:
                error = str(e)
        distributed.raise_if_any(d, error)
        per_rank = per_rank_extras(state, extras) if state else set()
        mine = {k: v for k, v in extras.items() if k in per_rank}
        same_world = bool(state) and len(rng) == d.world
        state, rng, shared, chosen = distributed.broadcast_object(
            d, (state, rng, {k: v for k, v in extras.items() if k not in per_rank}, chosen))
        if state is None:
            return None
        same_world = distributed.broadcast_object(d, same_world)
        own = distributed.scatter_object(d, [{k: v[r] for k, v in mine.items() if len(v) == d.world}
                                             for r in range(d.world)] if d.rank == 0 else None) if same_world else {}
        if sharded:  # every rank reads its own shards, whatever the world that wrote them (DCP reshards)
            try:
                checkpoint.load_sharded(Path(chosen), self.model, self.optimizer)
            except (RuntimeError, ValueError, KeyError) as e:
                error = f"checkpoint {chosen} does not fit this model: {(str(e).splitlines() or [type(e).__name__])[0]}"
            distributed.raise_if_any(d, error)
        else:
            distributed.broadcast_state(d, self.model, self.optimizer)
        if same_world:
            set_rng_state(rng[d.rank], d.device)
        self.state = state
        self.saved = {**shared, **own, **{p.name: state[p.name] for p in self.parts.values()
                                          if p.in_state and p.name in state}}
        for part in self.parts.values():
            self._hand(part)
        return state

    def _load_newest(self, found: list[Path], log, fits, sharded: bool):
        """Rank 0: (state.json, random states, the path of a sharded checkpoint, the extras) of the newest usable
        checkpoint of ``found``, its weights loaded into the model (unless sharded: every rank loads its own); all
        None and {} when there is none."""
        for ckpt in found:
            why = checkpoint.problem(ckpt)
            if why:
                log.say(f"checkpoint {ckpt} is unusable ({why}); trying the previous one")
                continue
            state, rng = checkpoint.read_state(ckpt)
            fits(ckpt, state)
            chosen = None
            try:
                if sharded and not checkpoint.is_sharded(ckpt):
                    raise UserError(f"checkpoint {ckpt} was written with training.parallel=ddp (whole weights, "
                                    f"model.safetensors): resume it with training.parallel=ddp")
                if sharded:
                    chosen = str(ckpt.absolute())
                elif checkpoint.is_sharded(ckpt):  # written by an fsdp run: whole weights on rank 0 alone
                    checkpoint.load_sharded(ckpt, self.model, self.optimizer, no_dist=True)
                else:
                    checkpoint.load_weights(ckpt, self.model, self.optimizer)
            except (RuntimeError, ValueError, KeyError) as e:
                raise UserError(f"checkpoint {ckpt} does not fit this model: {str(e).splitlines()[0]}") from None
            extras = {Path(f).stem: checkpoint.read_extra(ckpt, Path(f).stem) for f in state.get("extra_files", [])}
            log.say(f"resuming from {ckpt} (step {state['step']})")
            return state, rng, chosen, extras
        log.say("no checkpoint found: starting fresh" if not found else "no usable checkpoint: starting fresh")
        return None, None, None, {}
