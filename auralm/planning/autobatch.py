"""``training.batch_size=auto``: the largest micro-batch that fits this rank's memory, agreed by all ranks.

On a CUDA device: a forward and backward pass at 1, 2, 4, ... rows until one raises
torch.cuda.OutOfMemoryError (or its peak passes MARGIN of what torch.cuda.mem_get_info said was free,
less the optimizer's moments still to come), then a binary search between the last fit and the first
failure. On a CPU nothing is allowed to run out: the peak resident size (VmHWM, reset before each probe)
of a probe at two small batches gives a line, fixed + per_row x batch (the memory malloc holds after frees
is given back first, so the growth is measured from what is in use), and the answer is the largest batch
whose extrapolated growth stays within MARGIN of the memory this rank may still take, less RUN_RESERVE for
the rest of the run. That memory is what the machine has available (psutil), or what the node's memory
cgroup leaves (v1 ``memory.limit_in_bytes``, v2 ``memory.max``) when it is less, shared by the node's ranks
(LOCAL_WORLD_SIZE), and at most ``training.memory_limit_gb`` (or HRMCTL_MEMORY_LIMIT_GB) less what the
process already holds. A probe never runs a batch past that figure.

Then every rank's answer is gathered and the smallest taken; with ``training.global_batch_size``, grad_accum
is the smallest that splits global / world into micro-batches no larger than it (global = batch x accum x
world), else the batch is the probed one with the configured grad_accum (1 unless given).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from auralm.planning import cpu_memory
from auralm.errors import UserError
from node.cgroups import cgroup_memory, read

MARGIN = 0.8  # of the available memory, the share a probe's extrapolation may plan to use
MEMORY_ENV = "HRMCTL_MEMORY_LIMIT_GB"  # the same as training.memory_limit_gb; the smaller of the two wins
MAX_BATCH = 1 << 16  # no probe goes past this many rows
# CPU: kept aside, besides the margin, for what a run allocates outside its training steps (the evaluation,
# checkpoints, the plotting of curves.png at the end): in a small cgroup the margin alone was not enough
RUN_RESERVE = 128 << 20


@dataclass
class Fit:
    batch: int  # the largest micro-batch that fits this rank
    limit: str  # what bounded it, for the log: "budget 1.20 GB of 1.50 GB available (cgroup)", "cuda OOM at 64"


# ---------------------------------------------------------------- how much memory this rank may take (CPU)


def rss_bytes() -> int:
    import psutil

    return psutil.Process().memory_info().rss


def configured_limit_gb(memory_limit_gb: float) -> float:
    """training.memory_limit_gb and HRMCTL_MEMORY_LIMIT_GB: the smaller of those given (0: neither)."""
    given = [g for g in (memory_limit_gb, _env_gb()) if g and g > 0]
    return min(given) if given else 0.0


def _env_gb() -> float:
    text = os.environ.get(MEMORY_ENV, "").strip()
    if not text:
        return 0.0
    try:
        return float(text)
    except ValueError:
        raise UserError(f"{MEMORY_ENV}={text!r}: expected a number of GB") from None


def cpu_headroom(memory_limit_gb: float, local_world: int) -> tuple[int, str]:
    """Bytes this rank's process may still grow by, and where the figure comes from."""
    import psutil

    avail, source = psutil.virtual_memory().available, "available"
    cg = cgroup_memory()[1]  # what this process's memory cgroup (a container, a capped node) still gives
    if cg is not None and cg < avail:
        avail, source = cg, "available in the node's cgroup"
    share = avail // max(1, local_world)
    what = f"{share / 1e9:.2f} GB {source}" + (f" / {local_world} ranks" if local_world > 1 else "")
    limit = configured_limit_gb(memory_limit_gb)
    if limit:
        mine = int(limit * 1e9) - rss_bytes()
        if mine < share:
            share, what = max(0, mine), f"memory_limit_gb {limit:g} less {rss_bytes() / 1e9:.2f} GB held"
    return share, what


# ---------------------------------------------------------------- the probes


def _reset_peak() -> bool:
    """Reset the kernel's peak resident size of this process (VmHWM); False where that cannot be done."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _trim() -> None:
    """Give the memory malloc keeps after a free back to the kernel (auralm.planning.cpu_memory makes it keep freed
    blocks), so that a probe's growth is measured from what is really in use: otherwise a probe reuses held
    memory, shows no growth, and the line would promise more than fits."""
    import gc

    gc.collect()
    cpu_memory.give_back_freed_memory()


def _peak_rss() -> int:
    for line in read("/proc/self/status").splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def make_probe(objective, model, train_set, autocast, device: torch.device):
    """probe(b): one forward and backward pass at b rows (the first rows of the split, repeated when it is
    shorter); gradients and carries are dropped afterwards."""

    def probe(b: int) -> None:
        n = len(train_set)
        x, y = train_set.batch([i % n for i in range(b)])
        x, y = x.to(device), y.to(device)
        try:
            with autocast():
                loss, _ = objective.loss(model, x, y, 0)
            loss.backward()
        finally:
            del x, y
            model.zero_grad(set_to_none=True)
            objective.reset()

    return probe


def fit_cpu(probe, headroom: int, states_to_come: int, cap: int, what: str, run_reserve: int = 0) -> Fit:
    """The largest batch (<= cap) whose extrapolated growth fits MARGIN x headroom, from probes at two sizes."""
    budget = int(MARGIN * headroom) - states_to_come - run_reserve
    limit = f"budget {max(0, budget) / 1e9:.2f} GB = {MARGIN:.0%} of {what}" + \
        (f" less {states_to_come / 1e9:.2f} GB for optimizer state and copies" if states_to_come else "") + \
        (f" and {run_reserve >> 20} MiB for the rest of the run" if run_reserve else "")
    _trim()
    base = rss_bytes()

    resettable = [True]

    def growth(b: int) -> int:
        """The peak resident size a probe at b rows reached, above what the process held before any probe."""
        _trim()
        resettable[0] = _reset_peak() and resettable[0]
        probe(b)
        return max(0, _peak_rss() - base)

    g1 = growth(1)
    if g1 > budget:
        raise UserError(f"training.batch_size=auto: even one row needs about {g1 / 1e9:.2f} GB more, over the "
                        f"{limit}; use a smaller model, training.grad_checkpoint=true, or free memory on this node")
    b2 = min(cap, 8, max(1, budget // max(g1, 1)))  # never past the budget, even if growth were all per row
    if b2 <= 1:
        return Fit(1, limit)
    g2 = growth(b2)
    per_row = max((g2 - g1) / (b2 - 1), 1.0)
    if not resettable[0]:  # the peak may be an older one (loading the data): count all growth as per row
        per_row = max(per_row, g2 / b2)
    fixed = max(0.0, g1 - per_row)
    fits = int((budget - fixed) // per_row)
    return Fit(max(1, min(cap, fits)), limit + f" (per row {per_row / 1e6:.2f} MB, fixed {fixed / 1e6:.1f} MB)")


def fit_cuda(probe, device: torch.device, states_to_come: int, cap: int) -> Fit:
    """Powers of two, then a binary search between the last fit and the first failure (OOM, or a peak past
    MARGIN of what was free)."""
    free, total = torch.cuda.mem_get_info(device)
    budget = int(MARGIN * free) - states_to_come
    start = torch.cuda.memory_allocated(device)

    def fits(b: int) -> bool:
        torch.cuda.reset_peak_memory_stats(device)
        try:
            probe(b)
        except torch.cuda.OutOfMemoryError:
            torch.cuda.empty_cache()
            return False
        torch.cuda.synchronize(device)
        ok = torch.cuda.max_memory_allocated(device) - start <= budget
        torch.cuda.empty_cache()
        return ok

    if not fits(1):
        raise UserError(f"training.batch_size=auto: even one row does not fit the {free / 1e9:.2f} GB free on "
                        f"{device}; use a smaller model or training.grad_checkpoint=true")
    good, bad = 1, None
    while good < cap:
        b = min(cap, good * 2)
        if fits(b):
            good = b
        else:
            bad = b
            break
    while bad is not None and bad - good > 1:
        mid = (good + bad) // 2
        good, bad = (mid, bad) if fits(mid) else (good, mid)
    why = f"{bad} did not fit" if bad is not None else f"the cap {cap}"
    return Fit(good, f"{free / 1e9:.2f} GB free on {device}, {MARGIN:.0%} budget; {why}")


def find_fit(probe, device: torch.device, *, reserve_bytes: int, memory_limit_gb: float, local_world: int,
             cap: int) -> Fit:
    """This rank's largest micro-batch; ``reserve_bytes``: what training allocates besides a probe's forward and
    backward (the optimizer's state, DDP's buckets, ...), kept out of the budget."""
    states_to_come = reserve_bytes
    if device.type == "cuda":
        return fit_cuda(probe, device, states_to_come, cap)
    headroom, what = cpu_headroom(memory_limit_gb, local_world)
    return fit_cpu(probe, headroom, states_to_come, cap, what, RUN_RESERVE)


# ---------------------------------------------------------------- the plan


def plan_text(rank: int, fit: Fit, batch: int, accum: int, world: int) -> str:
    return (f"batch_size=auto: rank {rank} fits {fit.batch} ({fit.limit}), using {batch} x accum {accum} x "
            f"{world} ranks = {batch * accum * world}")
