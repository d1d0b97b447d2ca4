"""The sync strategies' interface and their one registry: how the ranks train together, chosen by name.

A strategy (single process, DDP, DiLoCo, FSDP, ...) is one class with the methods of ``Strategy`` below and one
``register`` call. ``training.sync`` and ``training.parallel`` name one: ``choose`` looks the names up here, and
config.py checks the values against ``names``. The trainer (auralm.training.train) only calls the interface: it never
asks which strategy it has.

The built-in strategies are registered by where their class lives (``module:Class``), so that this module, and
config.py and link_budget.py which read the registry, import no torch; a strategy registered from elsewhere (a
test, a plug-in) may hand its class itself. What the launcher and the config check must know of a mode without
importing it (torch) is declared in its registration, its ``Entry``: whether a node may leave in place, the
settings that are its alone, those it cannot be combined with, and why (``refusal``), and how the link budget
(auralm.planning.link_budget) says a suggestion of it and what work shares by speed do to its pace.

Imports the standard library only.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Callable, Protocol

OPTIONS = ("sync", "parallel")  # the training.<option> keys whose values name a strategy
DEFAULT = "ddp"  # both options' default: plain data parallel (a single process when alone)


class Training(Protocol):
    """What a strategy trains with: the trainer (auralm.training.train.Trainer), handed to ``Strategy.attach``.
    ``step``, ``position`` (batches this rank consumed) and ``done`` (samples or tokens since the last log line,
    counted over all ranks) move as it trains."""
    model: Any  # the model itself (sharded in place under FSDP), not a DDP wrapper
    optimizer: Any
    objective: Any  # auralm.training.objective.Plain or Recurrent: the loss of a batch, the ACT carries
    ema: Any  # auralm.training.ema.EMA or None
    guard: Any  # auralm.training.nan_guard.NanGuard or None
    train_set: Any
    shares: Any  # auralm.parallel.balance.Shares
    meter: Any  # auralm.training.objective.Meter
    # called by the loop's step: before_step(at), and after_backward(at, params) -> whether it made the gradients
    # non-finite on purpose (auralm.training.faults: a test's fault injection); none in a user's run
    hooks: list
    step: int
    position: int
    done: float


class Strategy:
    """The interface (the single-process strategy, auralm.parallel.single.Single, implements it all; the others
    change what differs). The training step is the loop's (auralm.training.step.TrainStep), the same in every mode;
    a mode says what the step asks of it and when the ranks meet. In the order the trainer calls them:

    - ``run_dir(out_dir)``: where the checkpoints go (FSDP: rank 0's directory, checked to be shared);
    - ``grad_copies``: extra copies of the gradients the strategy holds (DDP's buckets), for batch_size=auto;
    - ``shard(model)``: split the model over the ranks before its optimizer exists (FSDP); a phrase for the log;
    - ``sharded`` (the model is split over the ranks: every rank evaluates and saves) and ``sharded_checkpoints``
      (its checkpoints are DCP shards, also with one rank): how the trainer saves, resumes and evaluates;
    - ``inner_steps()``: local steps a round, for the work shares (DiLoCo), else None (``steps_a_round(training)``,
      the same from the config alone, for the link budget);
    - ``attach(training, ckpt, loop_step)``: take the trainer's parts (``Training``) and its step, and register with
      the checkpoint manager ``ckpt`` (auralm.training.checkpoint_manager) what it keeps in a checkpoint besides the
      weights: each part with its per-rank flag, handed its saved state as it registers when the run resumes;
    - ``say_start(log, step)``: its lines at the start of a run of several ranks;
    - ``wrap(ckpt)``: the model as trained (``model``: DDP's wrapper, its comm hook registered with ``ckpt``); the
      batches are made after it;
    - what the step asks, each step: ``batches(rank)`` (the rows a rank takes), ``micro_batch(last)`` (the context of
      a micro-batch's backward: DDP's no_sync), ``loss_scale`` (a rank's weight in the gradients' average),
      ``shard_norm(params)``, ``global_norm(norm)`` and ``guard_norm(norm, own)`` (the norms the clipping, the log
      and the NaN guard see: FSDP's over the shards), ``bad_step()`` (what a skipped step resets: PowerSGD's error
      feedback), ``per_step_ema``;
    - ``advance(loop_step)``: the ranks' next meeting: one of the loop's steps (every mode but DiLoCo), or a round of
      them: (the step it ended at, the loss, the grad norm);
    - ``finish_pending(loss)``: before an evaluation or a checkpoint (DiLoCo: the round in flight is finished); the
      loss;
    - ``meter_group()``: over which ranks the training metrics are averaged;
    - ``save(...)``: write a checkpoint the manager assembled (rank 0 the whole model, or every rank its shards);
    - ``final_model(whole)``: the trained model the trainer returns;
    - ``link_cost(budget, hook)`` (a class method, for auralm.planning.link_budget): the per-step communication this
      strategy pays on a link, as the budget's entry, or None when it sends nothing per step.
    """

    name = ""
    option = "sync"
    alone: str | None = None  # "module:Class" of the strategy for a world of one, when another (DDP: Single)
    several_ranks = True  # False: it trains one process (refused in a world of several)
    shards_states = False  # its ranks split the weights, gradients and optimizer state (FSDP): the memory preflight

    @classmethod
    def link_cost(cls, budget: dict, hook: str) -> dict | None:
        return None

    @classmethod
    def steps_a_round(cls, training) -> int | None:
        """The local steps between two synchronisations when it synchronises once a round (DiLoCo), else None."""
        return None

    waits = "every step waits for the slowest"  # for the link budget's line about unequal shares


@dataclass(frozen=True)
class Entry:
    """A registered strategy: its name, the option that names it, its class, and what it declares of itself."""
    name: str
    option: str
    target: Any  # the class, or "module:Class"
    in_place: bool = False  # a node of several may leave and come back while the others go on (min_nodes: 1)
    rounds: bool = False  # it synchronises once a round of local steps (its wire and streaming: the link budget's)
    owns: tuple[str, ...] = ()  # training.<key>s that apply to this strategy alone (refused at another value
    #                             than their default when another one is chosen)
    refuses: tuple[tuple[str, Any], ...] = ()  # (training.<key>, value) settings it cannot be combined with
    about: str = ""  # what it does, in the words its refusals end with
    # the link budget's words for a suggestion of it, from the suggestion's settings: "DiLoCo with H=50"
    named: Callable[[dict], str] | None = None
    paced: str = ""  # what shares by speed do to its pace, formatted with the budget's times ({auto_s}, ...)

    @property
    def spelled(self) -> str:
        return f"training.{self.option}={self.name}"

    def load(self) -> type:
        if isinstance(self.target, str):
            module, _, attr = self.target.partition(":")
            return getattr(importlib.import_module(module), attr)
        return self.target


_REGISTRY: dict[tuple[str, str], Entry] = {}


def register(name: str, target: Any, option: str = "sync", **declared: Any) -> None:
    """Make ``training.<option>=<name>`` choose ``target`` (a Strategy class, or "module:Class"); ``declared``:
    the Entry's other fields (in_place, rounds, owns, refuses, about, named, paced)."""
    if option not in OPTIONS:
        raise ValueError(f"option {option!r}: one of {', '.join(OPTIONS)}")
    _REGISTRY[(option, name)] = Entry(name, option, target, **declared)


def unregister(name: str, option: str = "sync") -> None:
    _REGISTRY.pop((option, name), None)


def names(option: str) -> tuple[str, ...]:
    """The values ``training.<option>`` takes: the strategies registered for it, and both options' DEFAULT
    (registered for training.sync; training.parallel at it leaves the choice to training.sync, chosen_name)."""
    return tuple(dict.fromkeys([DEFAULT, *(n for o, n in _REGISTRY if o == option)]))


def chosen_name(sync: str, parallel: str) -> tuple[str, str]:
    """(option, name) of the strategy two settings choose: training.parallel's unless it is the default."""
    return ("parallel", parallel) if parallel != DEFAULT else ("sync", sync)


def entry(sync: str, parallel: str = DEFAULT) -> Entry:
    """The registration of the strategy two settings choose."""
    return _REGISTRY[chosen_name(sync, parallel)]


def refusal(training: Any, defaults: Any) -> str | None:
    """What is wrong with the strategy settings of ``training`` (a TrainingConfig; ``defaults``: one as made), as
    a line for the user, or None: a strategy named by each option (one of them is the run's), a key another
    strategy owns set, a setting the chosen one refuses."""
    chosen = entry(training.sync, training.parallel)
    why = f": {chosen.about}" if chosen.about else ""

    def refused(key: str, value: Any, owner: Entry | None = None) -> str:
        whose = f", which applies to {owner.spelled}" if owner else ""
        instead = owner.spelled if owner else f"another training.{chosen.option}"
        return (f"{chosen.spelled} cannot be combined with training.{key}={_spelled(value)}{whose}{why} (drop "
                f"training.{key}, or choose {instead})")

    if chosen.option == "parallel" and training.sync != DEFAULT:
        return refused("sync", training.sync)
    for e in _REGISTRY.values():
        for key in e.owns if e.name != chosen.name else ():
            if getattr(training, key) != getattr(defaults, key):
                return refused(key, getattr(training, key), e)
    for key, value in chosen.refuses:
        if getattr(training, key) == value:
            return refused(key, value)
    return None


def _spelled(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def choose(sync: str, parallel: str, world: int) -> type:
    """The strategy class ``training.sync`` and ``training.parallel`` name, for a world of ``world`` ranks."""
    cls = _REGISTRY[chosen_name(sync, parallel)].load()
    if world == 1 and cls.alone:
        cls = Entry(cls.name, cls.option, cls.alone).load()
    return cls


def make(cfg, d) -> Strategy:
    """The strategy of this run (``cfg.training``'s sync and parallel), for rank ``d``."""
    from auralm.errors import UserError

    t = cfg.training
    cls = choose(t.sync, t.parallel, d.world)
    if d.world > 1 and not cls.several_ranks:
        option, name = chosen_name(t.sync, t.parallel)
        raise UserError(f"training.{option}={name} trains a single process, and this run has {d.world} ranks: "
                        f"run it alone, or choose another training.{option}")
    return cls(cfg, d)


def strategy_class(sync: str, parallel: str = DEFAULT) -> type:
    """The class a run of several ranks would use (for the link budget)."""
    return _REGISTRY[chosen_name(sync, parallel)].load()


def _ddp_named(s: dict) -> str:
    return "plain DDP" if s["ddp_comm_hook"] == "none" else f"DDP with the {s['ddp_comm_hook']} hook"


register("ddp", "auralm.parallel.ddp:DataParallel", owns=("ddp_comm_hook",), named=_ddp_named,
         paced="a DDP step of the global batch would take {auto_s} instead of {equal_s}")
register("diloco", "auralm.parallel.diloco_strategy:DiLoCoRounds", in_place=True, rounds=True,
         about="its rounds are sent as training.diloco.compress says (bf16 by default), not through DDP's comm hooks",
         named=lambda s: f"DiLoCo with H={s['inner_steps']}",
         paced="DiLoCo's rounds would go at the fastest rank's {diloco_s} a local step, the slower ranks taking fewer")
register("fsdp", "auralm.parallel.fsdp_strategy:Sharded", option="parallel", owns=("fsdp_cpu_offload",),
         refuses=(("dtype", "fp16"), ("ema", True)),
         about="FSDP shards the model and reduce-scatters full-precision gradients every step (no DiLoCo rounds, "
               "no DDP comm hooks, no fp16 loss scaling, no EMA copy); use training.parallel=ddp for that")
