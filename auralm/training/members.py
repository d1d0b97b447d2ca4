"""Who is still in a run whose ranks may leave it without the others restarting (training.sync=diloco on several
nodes with training.elastic.min_nodes below their count: a node asleep, cut off or killed), and the group of those
present.

Every rank beats: a thread adds 1 to the rank's counter in the run's store (torchrun's TCPStore, on the master)
every BEAT_S, over a connection of its own. A rank that waits for a collective (DiLoCo's round, the stop flag)
waits in ``wait(works, epoch)``: while the works are not done it reads the other present ranks' counters, and one
that has not moved for LOST_S (its rank frozen, its link cut, its process gone) is a leave. The first rank to see
it writes the next membership into the store (compare_set: every rank then reads the same one), every present
rank says in the store that it is ready (a member silent before all have: the next membership, without it), then
makes a new process group of it (``dist.new_group(..., use_local_synchronization=True)``: the ranks that
left take no part), and ``wait`` returns False: the caller sends its collective again on the new group. A
collective whose works are done on this rank counts as done only once every rank present has said so in the store:
a rank that leaves in its last moments can leave it done on one rank and not on another, and the first must not go on
while the second sends it again (whichever is written first, "done" or "again", holds for every rank). The
master's ranks never leave (the store and the checkpoints are there); the launcher (cli/launch/supervise/elastic.py)
starts a node that left again when it answers, and the whole run then resumes together.

Imports torch only.
"""

from __future__ import annotations

import collections
import json
import os
import sys
import threading
import time
from datetime import timedelta

import torch.distributed as dist
from torch.distributed import distributed_c10d

from node.torchrun import LEFT_OUT_EXIT  # a rank counted out while it was away (asleep) ends with it; the launcher
# starts it again, and the node's torchrun (node/torchrun.py) ends in one line

BEAT_S = 2.0
LOST_S = 15.0  # silent this long: left (the launcher's SSH keep-alive names it within about the same time)
FAILED_WAIT_S = 3 * LOST_S  # a collective that failed (a peer's connection reset) waits this long for a silence
BROKEN_LOST_S = 3 * BEAT_S  # once a collective failed (a peer's connection reset: its process killed), silent this
# long is enough: three beats missed by a rank whose connection just broke, not a slow one's pause
LOOK_S = 0.5  # how often a waiting rank reads the store (the counters, a membership written by another rank)
PREFIX = "hrmctl/members/"


def _client(timeout_s: float) -> "dist.TCPStore":
    """A connection of our own to the run's store (torchrun's, at MASTER_ADDR:MASTER_PORT)."""
    return dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                         timeout=timedelta(seconds=timeout_s), wait_for_workers=False)


def _abort(group, rank: int) -> None:
    """End the NCCL group of the ranks present before: its collective with the rank that fell silent never finishes,
    holds the GPU's NCCL stream, and NCCL's watchdog ends the process at the group's timeout. (Written for GPUs; tested
    here with a gloo group standing in for NCCL's: tests/trainer/test_diloco_leave.py.)"""
    try:
        distributed_c10d._abort_process_group(group)
    except Exception as exc:  # an NCCL too old to abort: the new group is made all the same
        print(f"rank {rank}: could not abort the NCCL group of the ranks before ({exc}); NCCL's watchdog may end "
              f"this process at that group's timeout", file=sys.stderr, flush=True)


class Membership:
    def __init__(self, rank: int, world: int, lost_s: float = LOST_S):
        self.rank, self.lost_s = rank, lost_s
        self.present = list(range(world))
        self.epoch = 0  # how many times the membership changed
        self.seq = 0  # how many collectives were waited for to the end (the same on every rank present)
        self._last: list[str] = []  # the store keys this rank wrote for the last one
        self._stale: collections.deque[str] = collections.deque()  # keys no rank reads any more, for the beat thread
        self.group = None  # the gloo group of the ranks present (None: the world)
        self.nccl_group = None  # and the NCCL one, when the run's device collectives use NCCL
        self.store = _client(30)
        self._seen: dict[int, tuple[int, float]] = {}  # rank -> (its count, when this rank saw it change)
        self.why = ""  # how this rank found the last leave it proposed (said by the first rank present)
        self._halt = threading.Event()
        self._beat_store = _client(10)
        self._thread = threading.Thread(target=self._beats, name="hrmctl-beat", daemon=True)
        self._thread.start()

    @property
    def changed(self) -> bool:
        return self.epoch > 0

    def _beats(self) -> None:
        """Beat every BEAT_S; and take the keys of collectives every rank is past out of the store (``_done``), here
        rather than in the wait: each is a request to the master."""
        key = f"{PREFIX}beat/{self.rank}"
        while True:
            try:
                self._beat_store.add(key, 1)
                while self._stale:
                    self._beat_store.delete_key(self._stale[0])
                    self._stale.popleft()
            except Exception:  # the store out of reach (this node cut off): beat again when it is back
                pass
            if self._halt.wait(BEAT_S):
                return

    def silent(self, among: list[int] | None = None, lost_s: float | None = None) -> list[int]:
        """The present ranks (or those ``among``; not this one) whose counter has not moved for ``lost_s`` (by
        default the membership's)."""
        now, gone, lost_s = time.monotonic(), [], self.lost_s if lost_s is None else lost_s
        for r in self.present if among is None else among:
            if r == self.rank:
                continue
            count = self.store.add(f"{PREFIX}beat/{r}", 0)
            last = self._seen.get(r)
            if last is None or last[0] != count:
                self._seen[r] = (count, now)
            elif now - last[1] > lost_s:
                gone.append(r)
        return gone

    def _written(self) -> list[int] | None:
        key = f"{PREFIX}epoch/{self.epoch + 1}"
        return json.loads(self.store.get(key)) if self.store.check([key]) else None

    def _propose(self, present: list[int]) -> list[int]:
        """The next membership: ours, unless another rank wrote one first (then theirs, for every rank alike)."""
        key = f"{PREFIX}epoch/{self.epoch + 1}"
        return json.loads(self.store.compare_set(key, "", json.dumps(present)))

    def wait(self, works: list, epoch: int) -> bool:
        """Wait for ``works`` (sent when the membership was ``epoch``): True when they are done on every rank present;
        False when the membership changed meanwhile (a rank left: the group is made again here), and they must be sent
        again on ``self.group``.

        Done here is not done everywhere: a rank that leaves in the last moments of a collective can leave it finished
        on one rank present and not on another, which would then send it again while the first went on. So a rank
        whose works are done says so in the store, and the collective counts as done only once every rank present has
        (``_outcome``: "done", or "again" when a rank is found silent first; whichever is written first holds for
        every rank)."""
        failed_at, look, said, polls = None, 0.0, False, 0
        mine = f"{PREFIX}done/{self.epoch}/{self.seq}/"
        while True:
            if epoch != self.epoch:
                return False
            if failed_at is None and not said and all(w.is_completed() for w in works):
                try:
                    for w in works:
                        w.wait()
                    self.store.set(mine + str(self.rank), "1")
                    said = True
                except Exception as exc:  # a peer's connection reset: a leave once its rank falls silent
                    failed_at, error = time.monotonic(), exc
            if said and self.store.check([mine + str(r) for r in self.present]) and self._outcome("done") == "done":
                return self._done(mine)
            if time.monotonic() >= look:  # the store, at most every LOOK_S (it is on the master, maybe over Wi-Fi)
                look = time.monotonic() + LOOK_S
                written = self._written()
                if written is None:
                    window = self.lost_s if failed_at is None else min(self.lost_s, BROKEN_LOST_S)
                    gone = self.silent(lost_s=window)
                    if gone:
                        if self._outcome("again") == "done":  # every rank present had it done: go on; the silent
                            return self._done(mine)  # rank is found at the next collective
                        self.why = f"silent for {window:g}s" + (" once a collective failed" if failed_at else "")
                        written = self._propose([r for r in self.present if r not in gone])
                elif self._outcome("again") == "done":  # a rank went on and found a leave at its next collective
                    return self._done(mine)
                if written is not None:
                    self._regroup(written)
                    return False
            if failed_at is not None and time.monotonic() - failed_at > FAILED_WAIT_S:
                raise error
            polls += said
            time.sleep((0.001 if polls < 20 else 0.01) if said else 0.05)  # the others' word comes within ms

    def _done(self, mine: str) -> bool:
        """The collective is done on every rank present: the next one's keys from here. The last one's keys go from
        the store (a long run would pile them up there; the beat thread takes them out): every rank present has said
        this one is done, so each has left the wait for the last one and reads its keys no more."""
        self._stale.extend(self._last)
        outcome = f"{PREFIX}outcome/{self.epoch}/{self.seq}"
        self._last = [mine + str(self.rank)] + ([outcome] if self.rank == self.present[0] else [])
        self.seq += 1
        return True

    def _outcome(self, proposed: str) -> str:
        """The outcome of the collective in wait (this membership's ``seq``-th): "done" (every rank present had it
        done) or "again" (sent again among the ranks present after a leave); the first rank to write it decides."""
        return self.store.compare_set(f"{PREFIX}outcome/{self.epoch}/{self.seq}", "", proposed).decode()

    def _ready(self, present: list[int]) -> list[int] | None:
        """Whether every rank of ``present`` (the membership of ``self.epoch``) is alive to make its group: None
        once each has said so in the store; else the next membership, when one of them fell silent first (killed
        while the others noticed another leave) and a rank wrote it. A group is made only of ranks that all said
        ready: making it waits for every member, and one that died before would hold the others there for good."""
        key = f"{PREFIX}ready/{self.epoch}/"
        self.store.set(key + str(self.rank), "1")
        while not self.store.check([key + str(r) for r in present]):
            written = self._written()
            if written is None:
                gone = self.silent(present)
                if gone:
                    self.why = f"silent for {self.lost_s:g}s"
                    written = self._propose([r for r in present if r not in gone])
            if written is not None:
                return written
            time.sleep(LOOK_S)
        return None

    def _regroup(self, present: list[int]) -> None:
        before = self.present
        while present is not None:
            if self.rank not in present:
                print(f"rank {self.rank}: counted out of the run while it did not answer (ranks present: {present}); "
                      f"ending: hrmctl starts it again and it rejoins", file=sys.stderr, flush=True)
                from auralm.training.distributed import exit_process
                exit_process(LEFT_OUT_EXIT)
            self.present, self.epoch = sorted(present), self.epoch + 1
            present = self._ready(self.present)
        gone = [r for r in before if r not in self.present]
        self.group = dist.new_group(ranks=self.present, backend="gloo", use_local_synchronization=True)
        if self.nccl_group is not None:
            before_nccl = self.nccl_group
            self.nccl_group = dist.new_group(ranks=self.present, backend="nccl", use_local_synchronization=True)
            _abort(before_nccl, self.rank)  # after: a group's name counts the groups there are (torch's new_group)
        if self.rank == self.present[0]:
            how = self.why or "found silent by another rank"
            print(f"rank(s) {', '.join(map(str, gone))} left the run ({how}); the round goes on with ranks "
                  f"{', '.join(map(str, self.present))}, not restarted", file=sys.stderr, flush=True)
        self.why = ""

    def close(self) -> None:
        self._halt.set()
