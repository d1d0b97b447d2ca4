"""Checkpoints: ``checkpoint-<step>/`` written atomically, validated on load, pruned to the last N plus the best.

A checkpoint holds ``model.safetensors``, ``optimizer.pt``, ``rng.pt`` (every rank's RNG state),
``state.json`` (step, data position, validation loss, guard state, the resolved config),
``config.yaml`` (the same resolved config plus ``vocab_size``, for people and for
``from_pretrained``; older checkpoints lack it and are still whole) and last ``checksums.json``
(sha256 of each of them). It is written into a temporary directory, fsynced, and renamed into
place, so a crash leaves either the whole checkpoint or none.

A sharded checkpoint (``training.parallel=fsdp``) holds ``dcp/`` instead of ``model.safetensors`` and
``optimizer.pt``: a torch.distributed.checkpoint directory (``.metadata`` and one ``__<rank>_0.distcp`` per
rank) with the model and optimizer state dicts under ``model`` and ``optimizer``, keyed by parameter name,
so it loads onto any number of ranks (DCP reshards) or into a whole model without a process group
(:func:`load_dcp_model`). Every rank writes its shards into the same temporary directory; rank 0 writes
the rest and the checksums (which cover the DCP files) once all have finished, then renames it into place.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
from pathlib import Path

import safetensors.torch
import torch
import yaml

from auralm.data.datadir import sha256_file
from auralm.training import failure

FILES = ("model.safetensors", "optimizer.pt", "rng.pt", "state.json")  # what every whole checkpoint has
DCP = "dcp"  # a sharded checkpoint's torch.distributed.checkpoint directory
SHARDED_FILES = (f"{DCP}/.metadata", "rng.pt", "state.json")  # what every sharded checkpoint has
CONFIG = "config.yaml"  # written since issue #17; checked when checksums.json lists it
_NAME = re.compile(r"^checkpoint-(\d+)$")


def step_of(path: Path) -> int:
    m = _NAME.match(path.name)
    return int(m.group(1)) if m else -1


def list_checkpoints(run_dir: Path) -> list[Path]:
    """The checkpoints in ``run_dir``, newest (highest step) first."""
    if not run_dir.is_dir():
        return []
    return sorted((p for p in run_dir.iterdir() if p.is_dir() and step_of(p) >= 0), key=step_of, reverse=True)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def config_yaml(config: dict) -> str:
    """``config`` as YAML, in its own key order; through JSON first, so it holds what state.json holds
    (tuples become lists) and nothing PyYAML's safe loader would refuse."""
    return yaml.safe_dump(json.loads(json.dumps(config)), sort_keys=False, allow_unicode=True)


def save(run_dir: Path, step: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer, rng: list,
         state: dict, keep_last: int, extra: dict | None = None) -> Path:
    """Write ``checkpoint-<step>`` atomically. ``extra``: more objects, each saved as ``<name>.pt`` and
    checksummed with the rest (the ACT carries of every rank, the EMA weights)."""
    with _partial_removed(run_dir, step):
        tmp = _fresh_tmp(run_dir, step)
        safetensors.torch.save_model(model, str(tmp / "model.safetensors"))
        torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
        return _finish(run_dir, tmp, step, list(FILES), rng, state, keep_last, extra)


@contextlib.contextmanager
def _partial_removed(run_dir: Path, step: int):
    """Around the writing of ``checkpoint-<step>``: whatever stops it, its temporary directory is removed; a write
    that failed for want of room or rights (a full or read-only disk, however the library words it: told before
    the removal frees room, auralm.training.failure) is raised as a WriteFailed from the library's error."""
    tmp = run_dir / f".checkpoint-{step}.tmp"
    try:
        yield
    except BaseException as e:
        failed = failure.wrap_write(e, tmp if tmp.exists() else run_dir, run_dir) if isinstance(e, Exception) else None
        shutil.rmtree(tmp, ignore_errors=True)
        if failed is None:
            raise
        failed.path = run_dir / f"checkpoint-{step}"
        raise failed from e


def _fresh_tmp(run_dir: Path, step: int) -> Path:
    run_dir.mkdir(parents=True, exist_ok=True)
    tmp = run_dir / f".checkpoint-{step}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    return tmp


def _finish(run_dir: Path, tmp: Path, step: int, files: list[str], rng: list, state: dict, keep_last: int,
            extra: dict | None) -> Path:
    """The files every checkpoint has beside its weights, the checksums of ``files`` and those, then the rename."""
    final = run_dir / f"checkpoint-{step}"
    torch.save(rng, tmp / "rng.pt")
    for name, obj in (extra or {}).items():
        torch.save(obj, tmp / f"{name}.pt")
    extras = sorted(f"{name}.pt" for name in extra or {})
    (tmp / "state.json").write_text(json.dumps(dict(state, step=step, extra_files=extras), indent=2) + "\n")
    files = [*files, *extras]
    if "config" in state:  # the run's resolved config, readable without this code (and by from_pretrained)
        (tmp / CONFIG).write_text(config_yaml(dict(state["config"], vocab_size=state.get("vocab_size"))))
        files.append(CONFIG)
    (tmp / "checksums.json").write_text(json.dumps({f: sha256_file(tmp / f) for f in files}, indent=2) + "\n")
    for f in tmp.rglob("*"):
        _fsync(f)
    for sub in (tmp / DCP, tmp):
        if sub.is_dir():
            _fsync(sub)
    if final.exists():  # a checkpoint of the same step from an earlier attempt
        old = run_dir / f".checkpoint-{step}.old"
        shutil.rmtree(old, ignore_errors=True)
        final.rename(old)
        shutil.rmtree(old)
    tmp.rename(final)
    _fsync(run_dir)
    prune(run_dir, keep_last)
    return final


def _val_loss(ckpt: Path) -> float:
    try:
        v = json.loads((ckpt / "state.json").read_text()).get("val_loss")
        return float("inf") if v is None else float(v)
    except (OSError, ValueError):
        return float("inf")


def prune(run_dir: Path, keep_last: int) -> None:
    """Keep the ``keep_last`` newest checkpoints and the one with the lowest validation loss."""
    ckpts = list_checkpoints(run_dir)
    keep = set(ckpts[:keep_last])
    if ckpts:
        keep.add(min(ckpts, key=lambda c: (_val_loss(c), -step_of(c))))
    for c in ckpts:
        if c not in keep:
            shutil.rmtree(c, ignore_errors=True)


def problem(ckpt: Path, required: tuple[str, ...] | None = None) -> str | None:
    """Why ``ckpt`` cannot be used (missing or changed files), or None when it is whole: every file
    checksums.json lists must match it, and it must list the ``required`` ones (by default FILES, or
    SHARDED_FILES for a sharded checkpoint; optional ones such as config.yaml are checked when listed)."""
    try:
        sums = json.loads((ckpt / "checksums.json").read_text())
    except (OSError, ValueError):
        return "checksums.json is missing or unreadable"
    if not isinstance(sums, dict):
        return "checksums.json is unreadable"
    if required is None:
        required = SHARDED_FILES if is_sharded(ckpt) or SHARDED_FILES[0] in sums else FILES
    for f in sums if set(required) <= set(sums) else required:
        if not (ckpt / f).exists():
            return f"{f} is missing"
        if sha256_file(ckpt / f) != sums.get(f):
            return f"{f} does not match its checksum (truncated or changed)"
    return None


def candidates(path: Path) -> list[Path]:
    """Checkpoints to try for ``path`` (a checkpoint or a run directory), best first: the named one
    (or the newest), then the older ones beside it, to fall back on."""
    if step_of(path) >= 0:
        return [path] + [c for c in list_checkpoints(path.parent) if step_of(c) < step_of(path)]
    return list_checkpoints(path)


def read_state(ckpt: Path) -> tuple[dict, list]:
    return json.loads((ckpt / "state.json").read_text()), torch.load(ckpt / "rng.pt", weights_only=True)


def load_weights(ckpt: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    missing, unexpected = safetensors.torch.load_model(model, str(ckpt / "model.safetensors"), strict=False)
    if missing or unexpected:
        raise ValueError(f"parameters differ: missing {sorted(missing)[:3]}, unexpected {sorted(unexpected)[:3]}")
    optimizer.load_state_dict(torch.load(ckpt / "optimizer.pt", weights_only=True, map_location="cpu"))


def read_extra(ckpt: Path, name: str):
    """An object saved with ``extra=`` (None when this checkpoint has none of that name)."""
    path = ckpt / f"{name}.pt"
    return torch.load(path, weights_only=True, map_location="cpu") if path.exists() else None


# ---------------------------------------------------------------- sharded checkpoints (training.parallel=fsdp)


def is_sharded(ckpt: Path) -> bool:
    """Whether ``ckpt`` is a sharded (DCP) checkpoint."""
    return (ckpt / DCP).is_dir()


def _distributed() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


def _barrier() -> None:
    import torch.distributed as dist

    if _distributed():
        dist.barrier()


def save_sharded(run_dir: Path, step: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer, rank: int,
                 rng: list | None, state: dict | None, keep_last: int, extra: dict | None = None) -> Path | None:
    """Every rank, together: write ``checkpoint-<step>`` with the model and optimizer in a DCP directory. Each
    rank writes its own shards into ``.checkpoint-<step>.tmp/dcp``; after a barrier (all have finished) rank 0
    (``rng``, ``state`` and ``extra`` are rank 0's) writes the rest and the checksums of everything, fsyncs and
    renames it into place; the path on rank 0, None on the others. ``run_dir`` must be the same directory for
    every rank (one file system)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    tmp = run_dir / f".checkpoint-{step}.tmp"
    with _partial_removed(run_dir, step) if rank == 0 else contextlib.nullcontext():
        if rank == 0:
            _fresh_tmp(run_dir, step)
            shared_modes(run_dir, [tmp, tmp / DCP])
        _barrier()
        model_sd, optim_sd = get_state_dict(model, optimizer)
        dcp.save({"model": model_sd, "optimizer": optim_sd}, checkpoint_id=str(tmp / DCP), no_dist=not _distributed())
        _barrier()  # every rank's shards are written (DCP writes .metadata last, on rank 0)
        final = None
        if rank == 0:
            files = sorted(str(f.relative_to(tmp)) for f in (tmp / DCP).rglob("*") if f.is_file())
            final = _finish(run_dir, tmp, step, [*files, "rng.pt", "state.json"], rng, state, keep_last, extra)
        _barrier()  # no rank goes on (to a resume, an export) before the checkpoint is in place
    return final


def shared_modes(run_dir: Path, dirs: list[Path]) -> None:
    """Create ``dirs`` with ``run_dir``'s permissions (less a sticky bit): on a file system the nodes share, the
    other ranks may run as other users, and a run directory writable by their group (or by all) lets them write
    their shards beside rank 0's, which a directory made under rank 0's umask would not."""
    mode = run_dir.stat().st_mode & 0o2777
    for d in dirs:
        d.mkdir(exist_ok=True)
        d.chmod(mode)


def load_sharded(ckpt: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None,
                 no_dist: bool = False) -> None:
    """Load a sharded checkpoint into ``model`` (sharded or whole) and ``optimizer``, whatever the number of ranks
    that wrote it (DCP reads the parts of each tensor this rank holds). Every rank calls it, unless ``no_dist``
    (one process alone, e.g. rank 0 of a ddp run)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict, StateDictOptions

    no_dist = no_dist or not _distributed()
    if optimizer is None:
        sd = {"model": model.state_dict()}
        dcp.load(sd, checkpoint_id=str(ckpt / DCP), no_dist=no_dist)
        model.load_state_dict(sd["model"])
        return
    model_sd, optim_sd = get_state_dict(model, optimizer)
    sd = {"model": model_sd, "optimizer": optim_sd}
    dcp.load(sd, checkpoint_id=str(ckpt / DCP), no_dist=no_dist)
    set_state_dict(model, optimizer, model_state_dict=sd["model"], optim_state_dict=sd["optimizer"],
                   options=StateDictOptions(strict=True))


def load_dcp_model(ckpt: Path, model: torch.nn.Module) -> None:
    """The weights of a sharded checkpoint into a whole model, in this process alone (no process group)."""
    import warnings

    with warnings.catch_warnings():  # DCP's "assuming the intent is to load in a single process": it is
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        load_sharded(ckpt, model, None, no_dist=True)
