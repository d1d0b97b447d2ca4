"""Train a model: ``python -m auralm.training.train [--check] [--resume] [key=value ...]``, alone or under torchrun.

With no arguments it trains a small model on generated sudoku puzzles (made in ``data/sudoku``
when missing). ``--check`` only validates the overrides. ``--resume`` is ``resume=latest``.
Keys: see ``auralm/training/config.py`` (e.g. ``task=lm data_dir=data/quijote model=tiny training.max_steps=500``).

``Trainer`` is a run: made by opening the run, the data and the model and resuming (its checkpoints through one
manager over stateful parts, auralm.training.checkpoint_manager), then ``fit`` steps, reports, evaluates and saves.
How the ranks train together (single process, DDP, DiLoCo, FSDP) is the sync strategy that ``training.sync`` and
``training.parallel`` name (auralm.parallel.strategy): the trainer calls its interface and never asks which it is.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import fcntl
import functools
import json
import math
import os
import sys
import time
from pathlib import Path

import torch

from auralm import errors, models, tasks
from auralm.data import datadir
from auralm.planning import autobatch, cpu_memory
from auralm.training import budget, checkpoint, config, distributed, failure, faults, optim, tracking
from auralm.training import objective as objectives
from auralm.training.budget import measure_rate  # noqa: F401 (the probe the work shares and the run's time use)
from auralm.training.config import Config
from auralm.training.curves import write_run_curves
from auralm.training.ema import EMA
from auralm.tools.evaluate import evaluate as evaluate_split
from auralm.errors import UserError
from auralm.training.nan_guard import NanGuard
from auralm.training.checkpoint_manager import CheckpointManager
from auralm.training.stop_request import StopRequest, stop_line
from auralm.parallel import balance, strategy
from auralm.training.precision import (autocast, bf16_compute, cpu_has_bf16, precision_said,  # noqa: F401
                                       rng_state, set_rng_state)  # (autocast ... re-exported)
from auralm.training.runlog import RunLog
from auralm.training import progress_file
from auralm.training.step import TrainStep
from auralm.models.args import ModelArgs


def memory_gb(device: torch.device) -> tuple[str, float]:
    """This rank's memory and what the figure is: on CUDA the peak of tensors allocated on the device
    (``cuda_peak``), else the process's resident set size now (``rss``, psutil)."""
    if device.type == "cuda":
        return "cuda_peak", torch.cuda.max_memory_allocated(device) / 1e9
    return "rss", _this_process().memory_info().rss / 1e9


def memory_record(device: torch.device) -> dict:
    """This rank's memory for the metrics, in GB: on CUDA the peak allocated (``cuda_peak_gb``, as memory_gb), the
    tensors allocated now (``cuda_allocated_gb``) and what the caching allocator holds (``cuda_reserved_gb``);
    else the resident set size (``rss_gb``)."""
    kind, gb = memory_gb(device)
    if device.type != "cuda":
        return {f"{kind}_gb": gb}
    return {f"{kind}_gb": gb, "cuda_allocated_gb": torch.cuda.memory_allocated(device) / 1e9,
            "cuda_reserved_gb": torch.cuda.memory_reserved(device) / 1e9}


def memory_text(mem: dict) -> str:
    """The log line's memory: ``rss 1.2G``, or on CUDA ``cuda peak 1.5G alloc 1.1G reserved 2.0G``."""
    if "rss_gb" in mem:
        return f"rss {mem['rss_gb']:.1f}G"
    return (f"cuda peak {mem['cuda_peak_gb']:.1f}G alloc {mem['cuda_allocated_gb']:.1f}G reserved "
            f"{mem['cuda_reserved_gb']:.1f}G")


@functools.cache
def _this_process():
    import psutil

    return psutil.Process()


# ---------------------------------------------------------------- start: data, output, resume


DEFAULT_DATA_ENV = "HRMCTL_DEFAULT_DATA_DIR"  # set by hrmctl: the data_dir it passes is the node's default


def default_data_dir(cfg: Config) -> bool:
    """Whether ``data_dir`` is a default place rather than the user's choice: not given, or the node's data
    directory from hrmctl's inventory (hrmctl passes it, and says so in HRMCTL_DEFAULT_DATA_DIR)."""
    return not cfg.data_dir or cfg.data_dir == os.environ.get(DEFAULT_DATA_ENV)


def cannot_write(path: Path) -> str | None:
    """Why ``path`` (a directory, made when missing) cannot be written by this process, or None."""
    base = path.absolute()
    while not base.exists() and base != base.parent:
        base = base.parent
    if not base.is_dir():
        return f"{base} is not a directory"
    if not os.access(base, os.W_OK | os.X_OK):
        return f"{base} is not writable by {_user()}"
    return None


def _user() -> str:
    try:
        import pwd

        return pwd.getpwuid(os.geteuid()).pw_name
    except (ImportError, KeyError):
        return f"uid {os.geteuid()}"


def open_data(cfg: Config, d: distributed.Dist) -> tuple[Path, dict]:
    """Check this rank's data; every rank's manifest must be the same as rank 0's (same meta.json hash).
    The default sudoku data is generated when missing in a default place (see default_data_dir).
    ``data.train_path=FILE``: local rank 0 of each node prepares FILE (auralm.data.datadir.prepare_lm: nothing to do
    when
    it is up to date) into datadir.train_path_dir(FILE), which is the data directory; the node's other ranks wait."""
    data_dir = Path(cfg.data_dir or f"data/{cfg.task}").expanduser()
    meta, error = None, None
    if cfg.data.train_path:
        source = Path(cfg.data.train_path).expanduser()
        data_dir, cached = datadir.train_path_dir(source)
        if not default_data_dir(cfg):
            error = (f"data.train_path={cfg.data.train_path} and data_dir={cfg.data_dir}: give one of them (the "
                     f"file is prepared into its own data directory, {data_dir})")
        elif d.local_rank == 0:
            try:
                if not source.is_file():
                    raise UserError(f"data.train_path={cfg.data.train_path}: no such file")
                data_dir.parent.mkdir(parents=True, exist_ok=True)
                with open(data_dir.parent / f".{data_dir.name}.lock", "w") as lock:  # nodes sharing a disk
                    fcntl.flock(lock, fcntl.LOCK_EX)
                    said = datadir.prepare_lm(str(source), data_dir, cfg.data.vocab_size, None, None, 0, None)
                where = f" (its directory is not writable: in the cache, {data_dir})" if cached else ""
                host = f"{d.host}: " if d.world > 1 else ""
                print(f"{host}data.train_path={cfg.data.train_path}{where}: {said}", flush=True)
            except UserError as e:
                error = str(e)
            except OSError as e:
                error = (f"cannot prepare data.train_path={cfg.data.train_path} in {data_dir}: {e.strerror or e} "
                         f"({e.filename or data_dir})")
        if d.world > 1:  # the other ranks wait for their node's preparation, however long it takes
            torch.distributed.monitored_barrier(timeout=datetime.timedelta(hours=24))
        distributed.raise_if_any(d, error)
        cfg.data_dir = str(data_dir)  # as the run's config.json records it
    try:
        task = tasks.get(cfg.task)
        if task.default_rows() and default_data_dir(cfg) and not (data_dir / "meta.json").exists():
            why = cannot_write(data_dir.parent)  # made beside it, then renamed into place
            if why:
                raise UserError(f"cannot generate the default {cfg.task} data in {data_dir}: {why}; make it "
                                f"writable, or give data_dir= a prepared data directory")
            task.make_default(data_dir)
        meta = datadir.load_manifest(data_dir, cfg.task)
    except UserError as e:
        error = str(e)
    except OSError as e:  # unreadable, or not writable after all (a read-only file system, a full disk)
        error = (f"cannot use the data in {data_dir}: {e.strerror or e} ({e.filename or data_dir}); fix its "
                 f"permissions or free space there, or give data_dir= another directory")
    distributed.raise_if_any(d, error)
    hashes = distributed.gather_object(d, (d.host, datadir.manifest_hash(data_dir)))
    odd = [(r, host) for r, (host, h) in enumerate(hashes) if h != hashes[0][1]]
    if odd:
        hosts = ",".join(dict.fromkeys(host for _, host in odd))
        raise UserError(f"the data on {', '.join(f'rank {r} (host {host})' for r, host in odd)} differs from rank 0's "
                        f"(host {hashes[0][0]}): {data_dir}/meta.json does not match; run `hrmctl sync-data "
                        f"{hosts if len(odd) == 1 else '--nodes ' + hosts}`")
    return data_dir, meta


def plan_output(cfg: Config) -> tuple[Path, list[Path]]:
    """Rank 0: the run directory, and the checkpoints to resume from (best first; empty: start fresh)."""
    if cfg.resume in ("", "latest"):
        if cfg.out_dir or cfg.run_name:
            out = Path(cfg.out_dir or Path("runs") / cfg.run_name)
        else:
            runs = [p for p in Path("runs").glob("*") if checkpoint.list_checkpoints(p)] if cfg.resume else []
            out = max(runs, key=lambda p: checkpoint.list_checkpoints(p)[0].stat().st_mtime) if runs else \
                Path("runs") / time.strftime("%Y%m%d-%H%M%S")
        return out, checkpoint.candidates(out) if cfg.resume else []
    path = Path(cfg.resume)
    if not path.exists():
        raise UserError(f"resume={cfg.resume}: no such checkpoint or run directory")
    found = checkpoint.candidates(path)
    if not found:
        raise UserError(f"resume={cfg.resume}: no checkpoint-<step> directory there")
    return Path(cfg.out_dir) if cfg.out_dir else found[0].parent, found


def shape(resolved: dict) -> dict:
    """What the weights of a checkpoint depend on: the model's shape (of a resolved config)."""
    skip = ("name", "dropout", "halt_max_steps", "halt_exploration_prob", "loss_type")
    return {k: v for k, v in resolved["model"].items() if k not in skip}


# ---------------------------------------------------------------- evaluation


@torch.no_grad()
def evaluate(model, val, cfg: Config, device: torch.device, tokenizer=None, whole: bool = False,
             step: int = 0) -> dict:
    """Rank 0: the validation metrics on the first batches of the split, or all of it, and for a model with a KV
    cache (GPT, RLM) a text sample: sampled (temperature 0.8, top-k 50) with a generator of its own seeded
    ``training.seed + step``, so it varies from one evaluation to the next and leaves training's RNG alone."""
    t = cfg.training
    out = evaluate_split(model, val, cfg.task, t.batch_size, None if whole else t.eval_batches, device,
                         autocast(t, device))
    if tokenizer is not None and hasattr(model, "new_cache"):
        from auralm.tools.generate import generate

        prompt = tokenizer(t.sample_prompt)["input_ids"] if t.sample_prompt else val.batch([0])[0][0, :16].tolist()
        ids = generate(model, torch.tensor(prompt, device=device), t.sample_tokens, temperature=0.8, top_k=50,
                       generator=torch.Generator().manual_seed(t.seed + step)).tolist()
        out["sample"] = tokenizer.decode(ids)
    return out


def _format(ev: dict) -> str:
    return " | ".join(f"{k} {v:.4f}" for k, v in ev.items() if isinstance(v, float))


# ---------------------------------------------------------------- sizes in epochs


def resolve_schedule(cfg: Config, d: distributed.Dist, n_train: int, log: RunLog) -> None:
    """``global_batch_size``, ``epochs`` and ``eval_every_epochs`` (the HRM guides' keys) as this run's batch
    size per rank, max_steps and eval_interval, now that the world and the train split are known. With
    ``batch_size=auto`` it waits for the probe (auto_batch), which calls it again with the batch it chose."""
    t = cfg.training
    if t.batch_size == config.AUTO:
        return
    global_batch = config.resolve_epochs(t, d.world, n_train)
    if t.global_batch_size or t.epochs or t.eval_every_epochs:
        log.say(f"schedule: {t.batch_size} per rank x {t.grad_accum} x {d.world} ranks = {global_batch} a step; "
                f"{t.max_steps} steps ({global_batch * t.max_steps / n_train:.2f} epochs of {n_train}), "
                f"eval every {t.eval_interval} steps")


# ---------------------------------------------------------------- the loop


def model_figures(model, log: RunLog, step: int) -> tuple[dict, str]:
    """A model's own figures of its last forward for the log line (``step_figures``, where its family has them:
    RLM's mHC amax), its warning said as an event; ({}, "") for a model without."""
    figures = getattr(model, "step_figures", None)
    if figures is None:
        return {}, ""
    metrics, text, warning = figures(step)
    if warning:
        warning = dict(warning)
        log.event(step, warning.pop("kind"), warning.pop("message"), **warning)
    return metrics, text


def probe_time(cfg: Config, d: distributed.Dist, objective, raw, train_set, val_set) -> tuple[float, float]:
    """This rank's training speed in rows/s (measure_rate, the probe of the work shares) and the seconds of one
    evaluation batch (auralm.training.budget.time_eval_batch); the model, its carries and the random state as found."""
    t = cfg.training
    rate = measure_rate(objective, raw, train_set, t, d.device)
    x, y = val_set.batch(range(min(t.batch_size, len(val_set))))
    return rate, budget.time_eval_batch(raw, x.to(d.device), y.to(d.device), t, d.device)


def plan_time(cfg: Config, d: distributed.Dist, shares: balance.Shares, step: int, probe: tuple[float, float],
              n_val: int, fresh: bool) -> tuple[budget.Timing, list[tuple[str, str]]]:
    """The run's time from every rank's probe (the slowest rank's step at its share of the batch, the slowest
    evaluation batch) and what auralm.training.budget.plan says of it; for a fresh run of no given length max_steps
    may be lowered to fit training.time_budget. Every rank gathers the same figures: they agree on max_steps."""
    t = cfg.training
    figures = distributed.gather_object(d, (*probe, budget.since_start()))
    step_s = max(shares.batch[r] * t.grad_accum / rate for r, (rate, _, _) in enumerate(figures))
    each, final = budget.eval_batches(cfg.task, n_val, t)
    timing = budget.Timing(step_s=step_s + cfg.fault.step_sleep, eval_batch_s=max(e for _, e, _ in figures),
                           each_batches=each, final_batches=final, gone_s=max(g for _, _, g in figures), ranks=d.world)
    return timing, budget.plan(cfg, timing, step, fresh)


def auto_batch(cfg: Config, d: distributed.Dist, raw, train_set, log: RunLog, grad_copies: int = 0) -> None:
    """``training.batch_size=auto``: every rank probes the largest micro-batch its memory holds
    (auralm.planning.autobatch), the ranks take the smallest, and grad_accum is set so that global_batch_size holds.
    The model's weights, the random state and the gradients are left as found. ``grad_copies``: the copies of the
    gradients the sync strategy holds besides the model's (DDP's buckets)."""
    t = cfg.training
    n = sum(p.numel() for p in raw.parameters())
    # allocated later, not in a probe: AdamW's two moments, DDP's gradient buckets, the EMA, the guard's snapshot
    reserve = 4 * n * (2 + grad_copies + bool(t.ema) + (3 if cfg.guard.enabled and d.rank == 0 else 0))
    cap = min(autobatch.MAX_BATCH, max(1, len(train_set) // d.world))
    if t.global_batch_size:
        cap = min(cap, max(1, t.global_batch_size // d.world))
    rng = rng_state(d.device)
    fit, error = None, None
    try:
        probe = autobatch.make_probe(objectives.make(raw, cfg), raw, train_set, lambda: autocast(t, d.device),
                                     d.device)
        fit = autobatch.find_fit(probe, d.device, reserve_bytes=reserve, memory_limit_gb=t.memory_limit_gb,
                                 local_world=int(os.environ.get("LOCAL_WORLD_SIZE", 1)), cap=cap)
    except UserError as e:
        error = str(e)
    set_rng_state(rng, d.device)
    distributed.raise_if_any(d, error)
    fits = distributed.gather_object(d, (d.host, fit.batch, fit.limit))
    agreed = min(b for _, b, _ in fits)
    t.batch_size, t.grad_accum = config.split_global_batch(agreed, d.world, t.global_batch_size, t.grad_accum)
    t._auto = True  # not a field: the config saved with the run has the batch chosen; oom_line says it was auto
    for r, (host, b, limit) in enumerate(fits):
        log.say(autobatch.plan_text(r, autobatch.Fit(b, limit), t.batch_size, t.grad_accum, d.world))
    log.event(0, "batch_size_auto", f"batch_size=auto: {t.batch_size} per rank x grad_accum {t.grad_accum} x "
              f"{d.world} ranks = {t.batch_size * t.grad_accum * d.world} a step", fits=[b for _, b, _ in fits],
              hosts=[h for h, _, _ in fits], batch_size=t.batch_size, grad_accum=t.grad_accum)


def shares_measured(cfg: Config, d: distributed.Dist) -> bool:
    """Whether the work shares come from every rank's measured rate (training.balance=auto, several ranks)."""
    return config.parse_balance(cfg.training.balance) == "auto" and d.world > 1


def decide_shares(cfg: Config, d: distributed.Dist, state: dict | None, measure,
                  inner_steps: int | None = None) -> balance.Shares:
    """Every rank's share (auralm.parallel.balance): the checkpoint's when resuming the same world with the same
    setting (a resumed run continues exactly), else measured (auto) or from the weights. ``inner_steps``: the
    strategy's local steps a round (DiLoCo), which the shares split, else None."""
    t = cfg.training
    spec = config.parse_balance(t.balance)
    nodes = distributed.gather_object(d, balance.node_name())
    saved = (state or {}).get("shares")
    if saved and len(saved["nodes"]) == d.world and saved.get("spec") == t.balance and \
            saved.get("sync") == t.sync and saved.get("per_rank") == t.batch_size:
        return balance.Shares(**{k: saved[k] for k in ("nodes", "weights", "batch", "inner_steps", "how")})
    odd = balance.unknown_nodes(spec, nodes)
    if odd:
        raise UserError(f"training.balance={t.balance} names {', '.join(odd)}, not in this run (its nodes: "
                        f"{', '.join(dict.fromkeys(nodes))})")
    rates = distributed.gather_object(d, measure()) if shares_measured(cfg, d) else None
    return balance.decide(spec, nodes, t.batch_size, inner_steps, rates)


def open_run(cfg: Config, d: distributed.Dist) -> tuple[Path | None, list[Path], RunLog]:
    """Rank 0 plans the run directory (checked writable) and the trackers; (it, the checkpoints to resume from,
    the run's log) on every rank."""
    out_dir, found, error, tracked = None, [], None, None
    if d.rank == 0:
        try:
            out_dir, found = plan_output(cfg)
            why = cannot_write(out_dir)
            if why:
                raise UserError(f"cannot write the run directory {out_dir}: {why}; give out_dir= a directory "
                                f"you can write, or fix its permissions")
            tracked = tracking.plan(cfg.logging)  # TensorBoard, W&B: their packages, W&B's mode
        except UserError as e:
            error = str(e)
    distributed.raise_if_any(d, error)
    return out_dir, found, RunLog(out_dir, tracked)


def open_splits(cfg: Config, d: distributed.Dist, log: RunLog):
    """The data: (its directory, its manifest, the model's resolved shape, the vocabulary, train and val splits);
    the schedule's sizes in epochs resolved."""
    data_dir, meta = open_data(cfg, d)
    arch = config.resolved_model(cfg.model)
    vocab = tasks.get(cfg.task).vocab(meta)
    train_set = tasks.open_split(data_dir, meta, "train", arch.block_size)
    val_set = tasks.open_split(data_dir, meta, "val", arch.block_size)
    if len(val_set) == 0:
        raise UserError(f"the validation split of {data_dir} is shorter than one window of {arch.block_size} tokens")
    resolve_schedule(cfg, d, len(train_set), log)
    return data_dir, meta, arch, vocab, train_set, val_set


def build_model(cfg: Config, d: distributed.Dist, s, arch: ModelArgs, vocab, train_set, log: RunLog) -> torch.nn.Module:
    """The model, the same initial weights on every rank, its batch chosen (batch_size=auto) and shared out over
    the ranks by the strategy (FSDP)."""
    t = cfg.training
    torch.manual_seed(t.seed)  # the same initial weights on every rank
    try:
        raw = models.build(cfg.task, arch, vocab).to(d.device)
    except ValueError as e:
        raise UserError(f"model={cfg.model.name}: {e}") from None
    raw.set_grad_checkpointing(t.grad_checkpoint)
    if t.batch_size == config.AUTO:  # before the optimizer's state, the guard's snapshot and the EMA exist,
        auto_batch(cfg, d, raw, train_set, log, s.grad_copies)  # and before sharding: each rank probes on its own
        resolve_schedule(cfg, d, len(train_set), log)
    s.shard(raw)
    return raw


def make_guard(cfg: Config, d: distributed.Dist, s, raw, optimizer, log: RunLog) -> NanGuard | None:
    t = cfg.training
    precision = "fp16" if t.dtype == "fp16" else "bf16" if bf16_compute(t, d.device) else "fp32"
    return NanGuard(cfg.guard, d, raw, optimizer, log, sharded=s.sharded, run=cfg, precision=precision) \
        if cfg.guard.enabled else None


class Trainer:
    """One rank's run: what it trains (the model, its optimizer, the ACT carries, the EMA, the NaN guard, the data),
    where it stands (the step, this rank's data position, the work shares) and what it reports and saves with (the
    run directory, the clock of the current log interval, the training time, the validation losses). The sync
    strategy (auralm.parallel.strategy) trains with it (``Training``: the fields it reads and moves); the checkpoint
    manager (auralm.training.checkpoint_manager) saves its parts and the strategy's, and hands them back on a resume.

    Made in the order a run opens: the run directory, the strategy, the data, the model and its parts, the probe of
    the step's time, the resume; ``fit()`` then steps, reports, evaluates and saves until ``training.max_steps``."""

    def __init__(self, cfg: Config, d: distributed.Dist):
        t = cfg.training
        self.cfg, self.d = cfg, d
        self.out_dir, found, self.log = open_run(cfg, d)
        self.s = strategy.make(cfg, d)
        self.ckpt_dir = self.s.run_dir(self.out_dir)
        self.data_dir, meta, self.arch, self.vocab, self.train_set, self.val_set = open_splits(cfg, d, self.log)
        self.model = build_model(cfg, d, self.s, self.arch, self.vocab, self.train_set, self.log)
        self.tokenizer = datadir.sample_tokenizer(self.data_dir / meta["tokenizer"]["path"]) \
            if tasks.get(cfg.task).tokenized and t.sample_tokens and (d.rank == 0 or self.s.sharded) and \
            hasattr(self.model, "new_cache") else None
        self.optimizer = optim.make_optimizer(self.model, t, d.device)
        self.objective = objectives.make(self.model, cfg)
        self.ema = EMA(self.model, t.ema_decay) if t.ema else None
        self.guard = make_guard(cfg, d, self.s, self.model, self.optimizer, self.log)
        self.train_step = TrainStep(cfg, d, self, self.s)  # the loop's step, the same in every mode
        torch.manual_seed(t.seed + d.rank)  # each rank its own dropout and halting exploration
        # before a resume's carries are loaded; every rank decides alike (the same config), and measures when the
        # work shares need its rate
        self.probe = probe_time(cfg, d, self.objective, self.model, self.train_set, self.val_set) \
            if shares_measured(cfg, d) or budget.worth_probing(cfg) else None
        self.ckpt = CheckpointManager(d, self.s, self.ckpt_dir, self.model, self.optimizer)
        self.register_parts()
        self.state = self.ckpt.resume(found, self.log, self.fits) if cfg.resume else None
        state = self.state or {}
        positions = state.get("data_positions")
        # where this rank stands: the checkpoint's step and data position (batches this rank has consumed)
        self.step = state.get("step", 0)
        self.position = positions[d.rank] if positions and len(positions) == d.world else \
            state.get("data_position", 0)
        self.hooks = faults.hooks(cfg.fault, d.rank, resumed=self.state is not None)
        self.meter, self.shares, self.done = objectives.Meter(), None, 0.0
        self.train_s = state.get("train_s", 0.0)  # training time so far, without evaluations and saving
        self.best = state.get("best_val_loss", float("inf"))
        self.val_loss = state.get("val_loss")
        self.timing: budget.Timing | None = None  # the probe's figures (auralm.training.budget): the evaluations' ETA
        self.clock = 0.0  # when the current log interval began
        self.start_step, self.start_train_s = self.step, self.train_s  # this session's start: the ETA's pace

    def register_parts(self) -> None:
        """What a checkpoint keeps of the trainer's parts besides the weights (the strategy adds its own as it
        attaches): each rank's ACT carries, the EMA's weights (a checkpoint without them: the average starts from
        its weights), the NaN guard's state."""
        if isinstance(self.objective, objectives.Recurrent):
            self.ckpt.register("carry", self.objective, per_rank=True)
        if self.ema is not None:
            self.ckpt.register("ema", self.ema, missing=lambda: self.ema.__init__(self.model, self.ema.decay))
        if self.guard is not None:
            self.ckpt.register("guard", self.guard, in_state=True)
        self.train_step.register(self.ckpt)

    def fits(self, ckpt: Path, state: dict) -> None:
        """Refuse a checkpoint of another task, model shape or vocabulary than this run's."""
        saved, now = state["config"], shape(config.to_dict(self.cfg))
        was = {k: shape(saved).get(k) for k in now}  # a key this model does not read is not its shape
        if (saved["task"], was, state.get("vocab_size")) != (self.cfg.task, now, self.vocab):
            raise UserError(f"checkpoint {ckpt} is for task={saved['task']} model {shape(saved)} "
                            f"(vocabulary {state.get('vocab_size')}), not this run's model {now} "
                            f"(vocabulary {self.vocab}): use a matching model or another out_dir")

    # ------------------------------------------------------------ the run

    def fit(self, whole: bool = True) -> torch.nn.Module:
        """Train to ``training.max_steps``: the trained model (see ``train`` for ``whole``)."""
        cfg, d, log, s, t = self.cfg, self.d, self.log, self.s, self.cfg.training
        kept = budget.resumed_length(cfg, self.state)  # a resumed run goes on to its own length unless one is given
        if self.step >= t.max_steps:
            log.say(f"nothing to do: the checkpoint is at step {self.step}, training.max_steps={t.max_steps}")
            return s.final_model(self.model, whole, self.arch, self.vocab)
        self.shares = decide_shares(cfg, d, self.state, lambda: self.probe[0], s.inner_steps())
        self.timing, said = plan_time(cfg, d, self.shares, self.step, self.probe, len(self.val_set),
                                      fresh=self.state is None) if self.probe else \
            (None, [("time", budget.unprobed_line(cfg))])  # plan_time may lower max_steps: before
        s.attach(self, self.ckpt, self.train_step)  # the strategy reads it (DiLoCo's outer step)
        if self.guard:
            self.guard.begin(self.step)
        self.say_start([("resumed_length", kept)] * bool(kept) + said)
        s.wrap(self.ckpt)
        self.train_step.start()
        self.clock = time.perf_counter()
        with StopRequest(d) as asked:  # SIGUSR1 (Slurm's time limit), and SIGTERM in a Slurm job: save, then end
            while self.step < t.max_steps:
                previous = self.step
                self.step, loss, norm = s.advance(self.train_step)  # a step, or a round of them (DiLoCo)
                log.progress(self.step, t.max_steps)  # a terminal: the bar below the lines
                final, halt = self.step == t.max_steps, asked.agreed()
                evaluating = final or due(t.eval_interval, previous, self.step)
                saving = final or halt or due(t.checkpoint_interval, previous, self.step)
                if evaluating or saving:  # both see, and a resume starts from, the weights every rank shares
                    loss = s.finish_pending(loss)
                if due(t.log_interval, previous, self.step) or evaluating:
                    self.report(loss, norm, evaluating, final)
                path = self.save() if saving else None
                if halt and not final:
                    log.say(stop_line(halt, self.step, t.max_steps, path))
                    break
        if d.world > 1:
            phrase, sums, equal = distributed.compare_checksums(d, self.model)
            log.event(self.step, "checksum", phrase, checksums=sums, equal=equal)
        if cfg.logging.curves:
            write_run_curves(self.out_dir, log.say)  # rank 0: curves.png (the others have no out_dir); never raises
        return s.final_model(self.model, whole, self.arch, self.vocab)

    def say_start(self, said: list[tuple[str, str]] = ()) -> None:
        """The run's first lines: its config, the model, its length and time (``said``: (kind, line) of
        auralm.training.budget), and with several ranks the backend, the strategy's lines and the work shares."""
        cfg, d, log, t = self.cfg, self.d, self.log, self.cfg.training
        log.config(config.to_dict(cfg), self.step)  # from here on the run directory is written (and TensorBoard, W&B)
        if d.rank == 0 and cfg.recipe_note:  # the paper's recipe the run follows (a pasted pretrain.py line: one)
            log.say(cfg.recipe_note)
        if d.rank == 0 and cfg.model_choice:  # a model the keys chose (arch=hrm_v1, model.hidden_dim=...): said
            log.say(f"model: {cfg.model_choice}")
        if d.rank == 0 and not self.state:
            n = sum(q.numel() for q in self.model.parameters())
            log.say(f"model {cfg.model.name} ({models.family_of(cfg.task, self.arch)}): {n / 1e6:.2f}M parameters, "
                    f"in {precision_said(t, d.device)}")
        if d.world > 1:
            log.event(0, "backend", f"backend: {d.reason}; using {d.backend} on all {d.world} ranks, device "
                      f"{d.device.type}", backend=d.backend, requested=d.requested, reason=d.why)
            self.s.say_start(log, self.step)
            if self.shares.how != "equal":
                log.event(self.step, "balance", f"balance {t.balance}: {self.shares.describe('rows/s')}",
                          **self.shares.to_dict())
        for kind, line in said:  # last: the lines just before the first step
            log.event(self.step, kind, line, max_steps=t.max_steps,
                      **(dataclasses.asdict(self.timing) if self.timing else {}))

    def report(self, loss: float, norm: torch.Tensor, evaluating: bool, final: bool) -> None:
        """The log line and metrics record of this step (training speed, memory, the ACT figures and the model's own:
        mHC's amax), with the evaluation when due; the progress file for `hrmctl top`."""
        cfg, d, log, t, step = self.cfg, self.d, self.log, self.cfg.training, self.step
        unit = "tok/s" if self.train_set.unit == "tokens" else "puzzles/s"
        elapsed = time.perf_counter() - self.clock
        rate = self.done / elapsed
        self.train_s += elapsed
        lr = self.train_step.lr(step)
        mem = memory_record(d.device)
        record = {"step": step, "train_s": round(self.train_s, 3), "loss": float(loss) if math.isfinite(loss) else None,
                  "lr": lr, ("tokens_per_s" if unit == "tok/s" else "samples_per_s"): rate, **mem,
                  "grad_norm": float(norm)}
        act = self.meter.read(self.s.meter_group(), self.objective.summarize)
        record.update(act)
        figures, text = model_figures(self.model, log, step)
        record.update(figures)
        record.update(self.s.wire_figures())
        key, label, places = tasks.get(cfg.task).train_metric
        extra = ("" if not act else f" | ponder {act['ponder']:.2f} | {label} {act[key]:.{places}f}") + text
        done = step - self.start_step  # this session's steps: the pace of the rest
        pace = (self.train_s - self.start_train_s) / done if done > 0 else 0.0
        eta = budget.eta(self.timing, t, step, pace)
        log.say(f"step {step}/{t.max_steps} | loss {float(loss):.4f} | lr {lr:.1e} | {rate:.0f} {unit}"
                f"{extra} | {memory_text(mem)} | eta {eta}")
        # a step all ranks log together (the metrics' all-reduce): not DiLoCo's
        if budget.replan_due(self.timing, self.start_step, step) and self.s.meter_group().world == d.world:
            self.replan_time(pace)
        if evaluating:
            record.update(self.evaluation(final))
        log.metrics(record)
        progress_file.write(d, record)  # every rank: its step, loss and rate, for `hrmctl top`
        self.done, self.clock = 0, time.perf_counter()

    def replan_time(self, pace_s: float) -> None:
        """A run the budget sized plans its length again from its own first steps (auralm.training.budget.replan:
        every rank reaches this log step, gathers the same figures and sets the same max_steps); config.json says the
        new one."""
        figures = distributed.gather_object(self.d, (pace_s, budget.since_start()))
        slowest = max(f[0] for f in figures)
        line = budget.replan(self.cfg, self.timing, self.start_step, self.step, slowest, max(f[1] for f in figures))
        if line:
            self.log.event(self.step, "time_budget", line, max_steps=self.cfg.training.max_steps, pace_s=slowest)
            self.log.config(config.to_dict(self.cfg), self.step)

    def evaluation(self, final: bool) -> dict:
        """Rank 0 (a sharded model: every rank, on its shards) evaluates the EMA's weights or the model's; rank 0
        logs it and keeps the best validation loss. The figures for the metrics record (rank 0's; else {})."""
        cfg, d, log, step, t = self.cfg, self.d, self.log, self.step, self.cfg.training
        task = tasks.get(cfg.task)
        if d.rank == 0 or self.s.sharded:  # fsdp: every rank runs the same forward passes on its shards
            with (self.ema.applied() if self.ema else contextlib.nullcontext()):
                ev = evaluate(self.model, self.val_set, cfg, d.device, self.tokenizer,
                              whole=final and task.solved_whole, step=step)
        if d.rank != 0:
            return {}
        self.val_loss = ev["val_loss"]
        self.best = min(self.best, self.val_loss)
        log.say(f"eval {step}/{t.max_steps} | " + _format(ev))
        if final and task.solved_whole:
            lo, hi = ev["ci95"]["exact_accuracy"]
            log.say(f"held-out exact accuracy {ev['exact_accuracy']:.3f} (95% interval {lo:.3f}-{hi:.3f}) on all "
                    f"{len(self.val_set)} test {task.unit} "
                    f"of {self.data_dir} ({task.accuracy.replace('_acc', '')} accuracy {ev[task.accuracy]:.3f}) after "
                    f"{self.train_s / 60:.1f} min of training")
        if "sample" in ev:
            log.say("sample: " + json.dumps(ev["sample"], ensure_ascii=False))
        return {k: v for k, v in ev.items() if k != "sample"}

    def save(self) -> Path | None:
        """A checkpoint of this step (auralm.training.checkpoint_manager): the registered parts, every rank's random
        state, and the run state: every rank's data position, the figures, the work shares. The path, on rank 0."""
        d, t = self.d, self.cfg.training
        began = time.perf_counter()
        positions = distributed.gather_object(d, self.position)
        run_state = {"data_position": self.position, "data_positions": positions, "val_loss": self.val_loss,
                     "best_val_loss": self.best, "vocab_size": self.vocab, "train_s": self.train_s, "world": d.world,
                     "parallel": t.parallel,
                     "shares": dict(self.shares.to_dict(), spec=t.balance, sync=t.sync, per_rank=t.batch_size)}
        path = self.ckpt.save(self.step, run_state, config.to_dict(self.cfg))
        if d.rank == 0:
            self.log.say(f"saved {path}")
        self.clock += time.perf_counter() - began  # throughput counts training time only
        return path


def due(interval: int, previous: int, step: int) -> bool:
    """Whether a multiple of ``interval`` (0: never) lies in (previous, step]."""
    return bool(interval) and step // interval > previous // interval


def train(cfg: Config, d: distributed.Dist, whole: bool = True) -> torch.nn.Module:
    """Train under ``cfg`` as rank ``d.rank``, synchronised by the strategy ``training.sync``/``training.parallel``
    name (auralm.parallel.strategy); the trained model (fsdp: a whole copy on the CPU when ``whole``, else the
    sharded model itself)."""
    return Trainer(cfg, d).fit(whole)


def run(cfg: Config, whole: bool = True, process_start: bool = False) -> torch.nn.Module:
    """Train under ``cfg`` in this process (one rank of torchrun's world, or alone); the trained model (see
    ``train`` for ``whole``: the command line, which discards it, does not ask fsdp to gather it). The time budget
    counts from now, or (``process_start``: the command line) from the process's start."""
    budget.mark_start(process_start)
    d = distributed.setup(cfg.backend, cfg.dist_timeout)
    if d.device.type == "cpu":
        cpu_memory.keep_freed_memory()
    with RunLog.closing():  # the progress bar, TensorBoard's and W&B's files: closed however training ends
        model = train(cfg, d, whole)
    distributed.teardown(d)
    return model


def out_of_memory(e: BaseException) -> bool:
    """Whether ``e`` is running out of memory: CUDA's OutOfMemoryError, a MemoryError, or the CPU allocator's
    RuntimeError ("DefaultCPUAllocator: can't allocate memory ...")."""
    if isinstance(e, (MemoryError, torch.cuda.OutOfMemoryError)):
        return True
    text = str(e)
    return isinstance(e, RuntimeError) and ("DefaultCPUAllocator" in text or "can't allocate" in text or
                                             "not enough memory" in text or "failed to allocate" in text.lower())


def oom_line(rank: int, e: BaseException, cfg: Config | None) -> str:
    """The one line for an out-of-memory error: what ran out, and what to lower."""
    where = "CUDA" if isinstance(e, torch.cuda.OutOfMemoryError) else "CPU"
    t = cfg.training if cfg is not None else None
    now = f" (now {t.batch_size}{f' x grad_accum {t.grad_accum}' if t.grad_accum > 1 else ''})" \
        if t is not None and t.batch_size else ""
    if t is not None and getattr(t, "_auto", False):
        fix = (f"training.batch_size=auto chose {t.batch_size}, which did not fit after all: lower "
               f"training.memory_limit_gb, give a smaller training.batch_size, or set training.grad_checkpoint=true")
    else:
        fix = (f"lower training.batch_size{now} (training.global_batch_size holds with a larger "
               f"training.grad_accum), or set training.batch_size=auto (the largest that fits), or "
               f"training.grad_checkpoint=true")
    return f"error: rank {rank}: out of {where} memory: {fix}"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    rank = int(os.environ.get("RANK", 0))
    cfg = None
    try:
        if any(a in ("-h", "--help") for a in args):
            print(__doc__.strip())
            return 0
        from auralm.training.command_line import parse_command_line  # the guides' spellings read as ours first

        cfg, check = parse_command_line(args)
        if check:
            return 0
        run(cfg, whole=False, process_start=True)
        return 0
    except UserError as e:
        return errors.stop(f"error: {e}", rank) if rank == 0 else errors.BAD_INPUT_EXIT
    except KeyboardInterrupt:
        return 130
    except Exception as e:
        return _failed(rank, e, cfg)


def _failed(rank: int, e: Exception, cfg: Config | None) -> int:
    """Every failure of a run in one line (auralm.training.failure reads what raised it): a file that could not be
    written for want of room or rights, whatever library wrote it (a stop: exit 2, with the last whole checkpoint
    to resume from), out of memory (a stop), a peer gone or a device failed (exit 1: a restart may help). Anything
    else is a bug: raised, with its traceback."""
    line = failure.write_line(rank, e, Path(cfg.out_dir) if cfg is not None and cfg.out_dir else None)
    if line:
        return errors.stop(line, rank)
    if out_of_memory(e):
        return errors.stop(oom_line(rank, e, cfg), rank)
    if failure.peer_gone(e):
        print(failure.peer_line(rank, e), file=sys.stderr, flush=True)
        return 1
    if not isinstance(e, RuntimeError):
        raise e
    first = (str(e).strip().splitlines() or [type(e).__name__])[0]  # a device failed: one line, not a traceback
    print(f"error: rank {rank}: {first}", file=sys.stderr, flush=True)
    return 1


if __name__ == "__main__":
    distributed.exit_process(main())
