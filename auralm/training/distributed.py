"""The process group, one backend agreed by all ranks, and the few collectives the trainer uses.

Every rank first joins a gloo group (it works on every machine); over it the ranks tell each
other what they can do and agree on the backend for the model's collectives: NCCL only when every
rank has a CUDA device and NCCL and a test all-reduce over NCCL succeeds on every rank, otherwise
gloo on all of them. Object collectives (decisions, checksums) always go over gloo. One process
(no WORLD_SIZE, or 1) runs without a process group; the helpers below then do nothing. The DDP
self-test (auralm.planning.ddp_check) uses the same agreement, with a group even for a world of one.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import socket
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from auralm.errors import UserError


@dataclass
class Dist:
    rank: int = 0
    world: int = 1
    local_rank: int = 0
    host: str = ""
    backend: str = "none"  # none (one process), gloo or nccl
    device: torch.device = torch.device("cpu")
    group: object = None  # the group for device tensors (DDP, broadcasts, the NaN flag); None: the default (gloo)
    requested: str = "auto"
    why: str = ""  # why this backend, for the log
    members: object = None  # auralm.training.members.Membership, when ranks may leave without the others restarting

    def group_for(self, t: torch.Tensor):
        """The group a collective of ``t`` goes over: of the ranks present (the world until one left)."""
        m = self.members
        if m is not None and m.changed:
            return m.nccl_group if t.is_cuda and self.group is not None else m.group
        return self.group if t.is_cuda else None

    @property
    def objects_group(self):
        """The group for object collectives and CPU flags (gloo): of the ranks present; None, the world."""
        return self.members.group if self.members is not None and self.members.changed else None

    @property
    def epoch(self) -> int:
        """How many times the ranks present changed (0 without a membership)."""
        return self.members.epoch if self.members is not None else 0

    def wait(self, works: list, epoch: int) -> bool:
        """Wait for ``works``, sent at membership ``epoch``: True when done; False when ranks left meanwhile, and
        they must be sent again (on the group of those present now)."""
        if self.members is not None:
            return self.members.wait(works, epoch)
        for w in works:
            w.wait()
        return True

    @property
    def present_count(self) -> int:
        """How many ranks are in the run now (the world until one left)."""
        return len(self.members.present) if self.members is not None else self.world

    @property
    def reason(self) -> str:
        """``why``, saying so when an NCCL request was turned down."""
        refused = self.requested == "nccl" and self.backend != "nccl"
        return ("nccl requested, but " if refused else "") + self.why


def probe_device(local_rank: int) -> dict:
    """What this rank can do: a CUDA device of its own, and NCCL. The one thing tests may fake."""
    if not torch.cuda.is_available():
        return {"cuda": False, "nccl": False, "why": "no CUDA device"}
    if torch.cuda.device_count() <= local_rank:
        return {"cuda": False, "nccl": False,
                "why": f"local rank {local_rank} but only {torch.cuda.device_count()} CUDA device(s)"}
    if not dist.is_nccl_available():
        return {"cuda": True, "nccl": False, "why": "this PyTorch build has no NCCL"}
    return {"cuda": True, "nccl": True, "why": ""}


def requested_backend(configured: str) -> str:
    """The config key wins; at its default ``auto``, the launcher's HRMCTL_BACKEND is the first guess."""
    if configured != "auto":
        return configured
    env = os.environ.get("HRMCTL_BACKEND", "auto").strip().lower() or "auto"
    if env not in ("auto", "nccl", "gloo"):
        raise UserError(f"HRMCTL_BACKEND={env!r}: expected auto, nccl or gloo")
    return env


def setup(configured_backend: str, timeout_s: int, *, group_of_one: bool = False) -> Dist:
    """Join the world and agree on the backend. One process has no process group unless
    ``group_of_one`` (the DDP self-test runs its collectives even alone)."""
    requested = requested_backend(configured_backend)
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    d = Dist(rank=rank, world=world, local_rank=local_rank, host=socket.gethostname(), requested=requested)
    cap = probe_device(local_rank)
    if world == 1 and not group_of_one:
        if cap["cuda"]:
            d.device = torch.device("cuda", local_rank)
        return d
    dist.init_process_group("gloo", timeout=timedelta(seconds=timeout_s))
    caps = gather_object(d, dict(cap, host=d.host))
    lacking = [(r, c) for r, c in enumerate(caps) if not c["nccl"]]
    if requested == "gloo":
        d.backend, d.why = "gloo", "gloo requested"
    elif lacking:
        r, c = lacking[0]
        d.backend, d.why = "gloo", f"rank {r} ({c['host']}) cannot use NCCL: {c['why']}"
    else:
        d.backend, d.why = "nccl", "every rank has a CUDA device and NCCL"
        d.device = torch.device("cuda", local_rank)
        d.group, failure = _start_nccl(d, caps, timeout_s)
        if failure:
            d.backend, d.group, d.why = "gloo", None, failure
    if all(c["cuda"] for c in caps):
        d.device = torch.device("cuda", local_rank)  # gloo carries CUDA tensors too (DDP supports it)
    return d


def _start_nccl(d: Dist, caps: list[dict], timeout_s: int):
    """An NCCL group, tested by one all-reduce; (None, reason) on every rank if it failed on any."""
    group, err = None, ""
    try:
        torch.cuda.set_device(d.device)
        group = dist.new_group(backend="nccl", timeout=timedelta(seconds=min(timeout_s, 120)))
        t = torch.ones(1, device=d.device)
        dist.all_reduce(t, group=group)
        if int(t.item()) != d.world:
            err = f"a test all-reduce gave {t.item()} instead of {d.world}"
    except Exception as e:  # any NCCL start failure: decided together below
        err = (str(e).strip().splitlines() or [type(e).__name__])[0]
    errors = gather_object(d, err)
    for r, e in enumerate(errors):
        if e:
            return None, f"NCCL could not start on rank {r} ({caps[r]['host']}): {e}"
    return group, ""


def exit_process(code: int) -> None:
    """End a rank's process with ``code`` once everything is written, without the interpreter's
    finalization: during it, gloo's worker threads may still hold tensors whose release needs the
    GIL, and the process aborts (SIGABRT, "terminate called without an active exception") after a
    run that finished well; torchrun would then report the rank as failed. Seen once in about 20
    two-node launches here."""
    import sys

    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    os._exit(code)


def teardown(d: Dist) -> None:
    if d.members is not None:
        d.members.close()
        if d.members.changed:  # the world's group may still wait for a rank that left: it is not destroyed (its
            return  # threads would wait out the timeout); the process ends with exit_process
    if dist.is_initialized():
        dist.destroy_process_group()


def gather_object(d: Dist, obj) -> list:
    """Every present rank's ``obj``, in rank order, on every rank (over gloo)."""
    if d.world == 1:
        return [obj]
    if d.members is not None:
        return _gather_present(d, obj)
    out = [None] * d.present_count
    dist.all_gather_object(out, obj, group=d.objects_group)
    return out


def _gather_present(d: Dist, obj) -> list:
    """``gather_object`` in a run whose ranks may leave (a checkpoint's gathers, say, while a node is cut off):
    all_gather_object's two steps, the sizes and then the padded bytes, as collectives that ``d.wait`` gives up
    when a rank falls silent, then sent again among the ranks present."""
    data = torch.frombuffer(bytearray(pickle.dumps(obj)), dtype=torch.uint8)
    while True:
        epoch, n = d.epoch, d.present_count
        sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(n)]
        mine = torch.tensor([data.numel()], dtype=torch.int64)
        if not d.wait([dist.all_gather(sizes, mine, group=d.objects_group, async_op=True)], epoch):
            continue
        padded = torch.zeros(int(max(s.item() for s in sizes)), dtype=torch.uint8)
        padded[:data.numel()] = data
        parts = [torch.empty_like(padded) for _ in range(n)]
        if not d.wait([dist.all_gather(parts, padded, group=d.objects_group, async_op=True)], epoch):
            continue
        return [pickle.loads(p[:int(s.item())].numpy().tobytes()) for p, s in zip(parts, sizes)]


def broadcast_object(d: Dist, obj):
    """Rank 0's ``obj`` on every rank."""
    if d.world == 1:
        return obj
    if d.members is not None:
        return _broadcast_present(d, obj)
    box = [obj]
    dist.broadcast_object_list(box, src=0, group=d.objects_group)
    return box[0]


def _broadcast_present(d: Dist, obj):
    """``broadcast_object`` in a run whose ranks may leave (a resume while a node is cut off, say): the size of rank
    0's pickled bytes, then the bytes, as collectives that ``d.wait`` gives up when a rank falls silent, then sent
    again among the ranks present."""
    data = pickle.dumps(obj) if d.rank == 0 else b""
    while True:
        epoch = d.epoch
        size = torch.tensor([len(data)], dtype=torch.int64)
        if not d.wait([dist.broadcast(size, src=0, group=d.objects_group, async_op=True)], epoch):
            continue
        buf = (torch.frombuffer(bytearray(data), dtype=torch.uint8) if d.rank == 0
               else torch.empty(int(size.item()), dtype=torch.uint8))
        if not d.wait([dist.broadcast(buf, src=0, group=d.objects_group, async_op=True)], epoch):
            continue
        return obj if d.rank == 0 else pickle.loads(buf.numpy().tobytes())


def _broadcast_tensors(d: Dist, tensors: list[torch.Tensor]) -> None:
    """Rank 0's values of ``tensors`` on every rank, in place; in a run whose ranks may leave, sent again among the
    ranks present when one falls silent meanwhile (as ``_broadcast_present``), each time into new buffers, copied
    into ``tensors`` once all arrived: a try given up cannot write into them later."""
    if d.members is None:
        for t in tensors:
            dist.broadcast(t, src=0, group=d.group_for(t))
        return
    while True:
        epoch = d.epoch
        bufs = tensors if d.rank == 0 else [torch.empty_like(t) for t in tensors]
        if d.wait([dist.broadcast(b, src=0, group=d.group_for(b), async_op=True) for b in bufs], epoch):
            break
    if d.rank != 0:
        with torch.no_grad():
            for t, b in zip(tensors, bufs):
                t.copy_(b)


def all_reduce_(d: Dist, t: torch.Tensor) -> torch.Tensor:
    if d.world > 1:
        dist.all_reduce(t, group=d.group_for(t))
    return t


def raise_if_any(d: Dist, error: str | None) -> None:
    """If any rank has an error, every rank raises it (naming the rank and host when there are several)."""
    for r, (host, e) in enumerate(gather_object(d, (d.host, error))):
        if e:
            raise UserError(e if d.world == 1 else f"rank {r} (host {host}): {e}")


def broadcast_state(d: Dist, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Give every rank rank 0's parameters, buffers and optimizer state, bit for bit."""
    if d.world == 1:
        return
    sd = optimizer.state_dict()
    layout = {i: {k: (tuple(v.shape), v.dtype) for k, v in s.items()} for i, s in sd["state"].items()}
    layout, groups = broadcast_object(d, (layout, sd["param_groups"]) if d.rank == 0 else None)
    if d.rank != 0:  # same structure as rank 0 (load_state_dict puts it on the parameters' devices) ...
        state = {i: {k: torch.empty(shape, dtype=dtype) for k, (shape, dtype) in s.items()} for i, s in layout.items()}
        optimizer.load_state_dict({"state": state, "param_groups": groups})
    # ... then rank 0's values, with its parameters and buffers
    _broadcast_tensors(d, [*model.state_dict().values(),
                           *(optimizer.state[p][k] for g in optimizer.param_groups for p in g["params"]
                             for k in sorted(optimizer.state.get(p, {})))])


def compare_checksums(d: Dist, model: torch.nn.Module) -> tuple[str, list[str], bool]:
    """Every rank's parameter checksum, gathered: (a phrase for the log, the checksums, all equal)."""
    sums = gather_object(d, checksum(model))
    equal = len(set(sums)) == 1
    return f"parameter checksum {sums[0]} {'equal on all ranks' if equal else 'DIFFERS: ' + ' '.join(sums)}", sums, equal


def checksum(model: torch.nn.Module) -> str:
    """sha256 over the bytes of every parameter and buffer, for comparing ranks bit for bit."""
    h = hashlib.sha256()
    for name, t in model.state_dict().items():
        if hasattr(t, "full_tensor"):  # fsdp: a DTensor shard; the whole tensor (all ranks call this together)
            t = t.full_tensor()
        h.update(name.encode())
        h.update(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:16]


def scatter_object(d: Dist, objs: list | None):
    """Rank 0's ``objs[r]`` on rank r."""
    if d.world == 1:
        return objs[0]
    if d.members is not None:  # every rank's part to all, so that a rank's silence can be waited out (_broadcast_present)
        return _broadcast_present(d, objs)[d.rank]
    box = [None]
    dist.scatter_object_list(box, objs, src=0, group=d.objects_group)
    return box[0]
