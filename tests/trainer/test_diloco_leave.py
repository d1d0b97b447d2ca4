"""DiLoCo's ranks go on without a node that leaves, on this machine: two torchrun agents (127.0.0.1, node ranks 0 and
1, gloo, one process each: lab/local.py) run the trainer as hrmctl's launch does for a DiLoCo run, and node1's
processes are stopped (SIGSTOP: a laptop asleep) once step 20 is logged. node0's rank finds rank 1 silent at the
round's all-reduce, goes on in the same process and takes over rank 1's rows: its data position at the end is the
whole world's (each rank's batches read from the position they would have had), not twice its own; node1's rank,
woken, finds itself counted out and ends (exit 75). The same on real lab nodes, with hrmctl's launcher and the
rejoin: tests/cluster/test_elastic.py; the loss against an uninterrupted run over several seeds:
bench/diloco_leave.py."""

from __future__ import annotations

import json
import os
import signal
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

from lab.local import process_tree, signal_tree, start_agents
from tests.polling import wait_for

pytestmark = pytest.mark.slow

STEPS = 60


@contextmanager
def _agents_at_step_20(sudoku_data, tmp_path, nodes: int, model: str = "tiny"):
    """A DiLoCo run of ``nodes`` local torchrun agents (of ``model``), once node0's rank has logged step 20: (its
    out_dir, the agents, node i's log text); whatever is left of them is killed at the end."""
    out = tmp_path / "run"
    args = [f"model={model}", f"training.max_steps={STEPS}", "training.batch_size=8", "training.log_interval=10",
            "logging.curves=false",
            "training.checkpoint_interval=0", "training.eval_interval=0", "training.eval_batches=1",
            "training.sync=diloco", "training.diloco.inner_steps=10", f"data_dir={sudoku_data()}", f"out_dir={out}"]
    logs = [tmp_path / f"node{r}.log" for r in range(nodes)]
    procs = start_agents(args, logs)
    text = lambda r: logs[r].read_text()  # noqa: E731
    try:
        wait_for(lambda: "step 20/" in text(0) or procs[0].poll() is not None, 180, "step 20", every=0.2)
        yield out, procs, text
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()


def test_the_rank_present_goes_on_in_place_and_takes_over_the_rows_of_the_one_that_left(sudoku_data, tmp_path):
    with _agents_at_step_20(sudoku_data, tmp_path, 2) as (out, procs, text):
        node1 = process_tree(procs[1].pid)
        signal_tree(node1, signal.SIGSTOP)
        try:
            wait_for(lambda: "rank(s) 1 left the run" in text(0) or procs[0].poll() is not None, 60,
                     "node0's rank to go on without rank 1", every=0.5)
        finally:
            signal_tree(node1, signal.SIGCONT)
        assert procs[0].wait(timeout=300) == 0, text(0)[-3000:]
        assert procs[1].wait(timeout=60) != 0, text(1)[-3000:]
    assert "rank(s) 1 left the run (silent for 15s)" in text(0), text(0)[-3000:]  # asleep: its connections stay open
    assert "rank 0 takes rank(s) 1's rows beside its own (2 micro-batches a local step)" in text(0), text(0)[-3000:]
    assert "counted out of the run" in text(1), text(1)[-3000:]
    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps[-1] == STEPS
    state = json.loads((out / f"checkpoint-{STEPS}" / "state.json").read_text())
    # one batch of each rank a step, whoever took it: the position of a run that every rank saw to its end
    assert state["data_position"] == STEPS and state["data_positions"] == [STEPS], state


@pytest.mark.parametrize("model", ["tiny", "trm-tiny"])
def test_a_killed_rank_is_left_out_after_three_missed_beats_since_its_connection_broke(sudoku_data, tmp_path, model):
    """node1's processes killed at step 20 (SIGKILL: the kernel closes their connections): node0's rank's all-reduce
    with rank 1 fails, and a rank silent for three beats since (members.BROKEN_LOST_S, 6 s) is counted out, not after
    the 15 s a silent rank gets (asleep or cut off: no connection of its breaks, and a slow beat is not a leave).
    With a recurrent model (TRM) too: the rows node0's rank takes over are micro-batches of its step beyond its
    own, each with an ACT carry of its own."""
    with _agents_at_step_20(sudoku_data, tmp_path, 2, model) as (out, procs, text):
        signal_tree(process_tree(procs[1].pid), signal.SIGKILL)
        wait_for(lambda: "rank(s) 1 left the run" in text(0) or procs[0].poll() is not None, 60,
                 "node0's rank to go on without rank 1", every=0.5)
        assert procs[0].wait(timeout=300) == 0, text(0)[-3000:]
    assert ("rank(s) 1 left the run (silent for 6s once a collective failed); the round goes on with ranks 0, not "
            "restarted") in text(0), text(0)[-3000:]
    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps[-1] == STEPS


def test_a_rank_killed_while_the_others_regroup_is_left_out_too_and_the_run_goes_on(sudoku_data, tmp_path):
    """Three nodes: node1's processes stopped at step 20, and node2's killed 8 s later, before rank 1's silence is
    a leave. node0's rank writes the membership of ranks 0 and 2, but rank 2 never says it is ready for that group
    (making a group waits for every member: with a dead one, for good); once rank 2 is silent too, the next
    membership is rank 0 alone, which finishes the run in the same process, taking both ranks' rows."""
    with _agents_at_step_20(sudoku_data, tmp_path, 3) as (out, procs, text):
        node1 = process_tree(procs[1].pid)
        signal_tree(node1, signal.SIGSTOP)
        try:
            time.sleep(8)
            signal_tree(process_tree(procs[2].pid), signal.SIGKILL)
            wait_for(lambda: "the round goes on with ranks 0, not restarted" in text(0) or procs[0].poll() is not None,
                     90, "node0's rank to go on alone", every=0.5)
        finally:
            signal_tree(node1, signal.SIGCONT)
        assert procs[0].wait(timeout=300) == 0, text(0)[-3000:]
    assert "rank 0 takes rank(s) 1, 2's rows beside its own (3 micro-batches a local step)" in text(0), text(0)[-3000:]
    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps[-1] == STEPS


def _gloo_pair(rank: int, port: int) -> None:
    """Rank ``rank`` of a gloo world of two on 127.0.0.1:``port`` (rank 0 holds the store)."""
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    store = dist.TCPStore("127.0.0.1", port, 2, is_master=rank == 0, wait_for_workers=False)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2)


def _run_ranks(target, tmp_path, wait_for: tuple[int, ...], ranks: int = 2) -> list[dict]:
    """``target(rank, port, out)`` in two processes (or ``ranks``) forked from the trainer tier's fork server; waits
    (60 s) for the ranks in ``wait_for``, kills what is left, and returns what each rank wrote to ``out.<rank>``
    (None: nothing)."""
    from tests.trainer.helpers import _forked, free_port

    port, out = free_port(), tmp_path / "rank"
    procs = [_forked().Process(target=target, args=(r, port, str(out))) for r in range(ranks)]
    for p in procs:
        p.start()
    try:
        for r in wait_for:
            procs[r].join(60)
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
    return [json.loads(Path(f"{out}.{r}").read_text()) if Path(f"{out}.{r}").exists() else None for r in range(ranks)]


def _gather_with_rank_1_asleep(rank: int, port: int, out: str) -> None:
    """Both ranks gather once, then rank 1 stops itself (a laptop asleep) and rank 0 gathers again, as a
    checkpoint's gathers do (auralm.training.checkpoint_manager)."""
    from auralm.training.distributed import Dist, gather_object
    from auralm.training.members import Membership

    _gloo_pair(rank, port)
    d = Dist(rank=rank, world=2, backend="gloo", members=Membership(rank, 2, lost_s=3))
    both = gather_object(d, {"rank": rank})
    if rank == 1:
        os.kill(os.getpid(), signal.SIGSTOP)
    alone = gather_object(d, ["after", rank])
    with open(f"{out}.{rank}", "w") as f:
        json.dump({"both": both, "alone": alone, "present": d.members.present}, f)
    os._exit(0)


def test_an_object_gather_goes_on_among_the_ranks_present_when_one_falls_asleep_during_it(tmp_path):
    """A node cut off just after a round, while the checkpoint gathers every rank's random state and data position:
    the gather is given up once its rank is silent and made again among those present, instead of waiting for
    it for good (seen once on the lab: node0's rank stuck before saving, until node1's link came back)."""
    got, _ = _run_ranks(_gather_with_rank_1_asleep, tmp_path, wait_for=(0,))
    assert got is not None, "rank 0 did not finish its gather without the sleeping rank 1"
    assert got == {"both": [{"rank": 0}, {"rank": 1}], "alone": [["after", 0]], "present": [0]}, got


def _resume_with_rank_1_asleep(rank: int, port: int, out: str) -> None:
    """Both ranks take rank 0's weights and optimizer state (each rank's own differ) and write their checksums; then
    rank 1 stops itself (a laptop asleep) and rank 0 sends what a resume sends (train.py's resume: an object, every
    rank's part, the weights and optimizer state), each more than a socket's buffers hold, so that a send to the
    sleeping rank cannot complete by itself."""
    import torch

    from auralm.training.distributed import Dist, broadcast_object, broadcast_state, checksum, scatter_object
    from auralm.training.members import Membership

    _gloo_pair(rank, port)
    d = Dist(rank=rank, world=2, backend="gloo", members=Membership(rank, 2, lost_s=3))
    torch.manual_seed(rank)
    model = torch.nn.Linear(1024, 1024)
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.randn(2, 1024)).sum().backward()
    optimizer.step()
    mine = checksum(model)
    broadcast_state(d, model, optimizer)
    both = {"own": mine, "taken": checksum(model), "exp_avg": float(optimizer.state[model.weight]["exp_avg"].sum())}
    with open(f"{out}.{rank}", "w") as f:
        json.dump({"both": both}, f)
    if rank == 1:
        os.kill(os.getpid(), signal.SIGSTOP)
    big = broadcast_object(d, bytes(8 << 20))
    part = scatter_object(d, [bytes(4 << 20), bytes(4 << 20)])
    broadcast_state(d, model, optimizer)
    with open(f"{out}.{rank}", "w") as f:
        json.dump({"both": both, "big": len(big), "part": len(part), "present": d.members.present}, f)
    os._exit(0)


def test_a_resume_goes_on_among_the_ranks_present_when_one_falls_asleep_during_it(tmp_path):
    """A node cut off while the run resumes (a rejoin's restart): rank 0's objects, weights and optimizer state are
    sent again among the ranks present once the silent rank is counted out, instead of waiting for it for good.
    Before that, with both present, rank 1 takes rank 0's weights and optimizer state in place of its own."""
    got, asleep = _run_ranks(_resume_with_rank_1_asleep, tmp_path, wait_for=(0,))
    assert got is not None and "big" in got, "rank 0 did not finish its resume without the sleeping rank 1"
    assert (got["big"], got["part"], got["present"]) == (8 << 20, 4 << 20, [0]), got
    assert asleep["both"]["own"] != got["both"]["own"], (asleep, got)  # the ranks began with different weights
    assert asleep["both"]["taken"] == got["both"]["taken"] == got["both"]["own"], (asleep, got)
    assert asleep["both"]["exp_avg"] == got["both"]["exp_avg"], (asleep, got)


def _device_round_with_rank_1_asleep(rank: int, port: int, out: str) -> None:
    """A round's all-reduce on the device group of a run whose collectives use NCCL, with a gloo group standing in for
    NCCL's (this machine has no GPU and no NCCL: only the backend is a stand-in; the membership, the store and the
    groups' making are real). Both ranks all-reduce on it; rank 1 stops itself (a laptop asleep); rank 0's next
    all-reduce on it cannot finish, rank 1 is counted out, and rank 0 goes on with a group of the ranks present."""
    import torch
    import torch.distributed as dist
    from torch.distributed import distributed_c10d

    from auralm.training.distributed import Dist
    from auralm.training.members import Membership

    _gloo_pair(rank, port)
    made, aborted = [], []
    real_new_group, real_abort = dist.new_group, distributed_c10d._abort_process_group

    def new_group(*args, backend=None, **kw):
        made.append({"ranks": kw.get("ranks"), "backend": backend, "local": kw.get("use_local_synchronization")})
        return real_new_group(*args, backend="gloo", **kw)

    def abort(group=None):
        aborted.append(group)
        real_abort(group)

    dist.new_group, distributed_c10d._abort_process_group = new_group, abort
    world_nccl = dist.new_group(backend="nccl")  # as distributed.setup makes it once every rank can use NCCL
    d = Dist(rank=rank, world=2, backend="nccl", group=world_nccl, members=Membership(rank, 2, lost_s=3))
    d.members.nccl_group = d.group  # as the DiLoCo strategy sets it
    both = torch.ones(4)
    dist.all_reduce(both, group=world_nccl)
    if rank == 1:
        os.kill(os.getpid(), signal.SIGSTOP)
    work = dist.all_reduce(torch.ones(4), group=world_nccl, async_op=True)
    done = d.wait([work], d.epoch)

    class OnTheGpu:  # what group_for reads of a tensor
        is_cuda = True

    present = d.group_for(OnTheGpu())
    alone = torch.ones(4)
    dist.all_reduce(alone, group=present)
    with open(f"{out}.{rank}", "w") as f:
        json.dump({"both": both.tolist(), "done": done, "aborted_world": [g is world_nccl for g in aborted],
                   "made": made[1:], "new_device_group": present is d.members.nccl_group and present is not world_nccl,
                   "alone": alone.tolist(), "present": d.members.present}, f)
    os._exit(0)


def test_the_nccl_group_of_the_ranks_before_is_aborted_and_one_of_those_present_made(tmp_path):
    """Under NCCL a collective with a silent rank never finishes: it holds the GPU's NCCL stream, and NCCL's watchdog
    ends the process at the group's timeout. So when a rank leaves, the NCCL group of the ranks before is aborted
    (auralm/training/members.py ``_abort``) and the device collectives go on over an NCCL group of those present.
    Only NCCL is a stand-in here (a gloo group in its place): what a GPU would do with it is not tested."""
    got, _ = _run_ranks(_device_round_with_rank_1_asleep, tmp_path, wait_for=(0,))
    assert got is not None, "rank 0 did not go on without the sleeping rank 1"
    assert got["both"] == [2.0] * 4 and got["done"] is False, got  # the round with rank 1 asleep was given up
    assert got["aborted_world"] == [True], got  # the NCCL group of both ranks, and only it
    assert got["made"] == [{"ranks": [0], "backend": "gloo", "local": True},
                           {"ranks": [0], "backend": "nccl", "local": True}], got
    assert got["new_device_group"] and got["alone"] == [1.0] * 4 and got["present"] == [0], got


def _rounds_apart(rank: int, port: int, out: str) -> None:
    """Rank ``rank`` of two sends a DiLoCo round ending at step 10 (rank 0) or 20 (rank 1), as two ranks would
    after one of them finished a collective the other was still in when a third left."""
    import torch

    from auralm.parallel.diloco import DiLoCo
    from auralm.training.config import DilocoConfig
    from auralm.training.distributed import Dist

    _gloo_pair(rank, port)
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    outer = DiLoCo(model, DilocoConfig(outer_lr=0.7, outer_momentum=0.9), Dist(rank=rank, world=2, backend="gloo"),
                   0.5)
    before = [p.detach().clone() for p in outer.shared]
    outer.start(0, 1.0, 1, carry=False, end=10 * (rank + 1))
    try:
        outer.finish()
        error = ""
    except RuntimeError as exc:
        error = str(exc)
    unchanged = all(torch.equal(a, b) for a, b in zip(before, outer.shared))
    with open(f"{out}.{rank}", "w") as f:
        json.dump({"error": error, "unchanged": unchanged}, f)
    os._exit(0)


def test_ranks_that_sent_different_rounds_stop_instead_of_averaging_them(tmp_path):
    for r, got in enumerate(_run_ranks(_rounds_apart, tmp_path, wait_for=(0, 1))):
        assert got["unchanged"] and got["error"].startswith(
            f"rank {r}: the ranks present sent different rounds (this one ends at step {10 * (r + 1)}; their steps "
            "sum to 30 over 2 ranks)"), got


class _Work:
    """A collective's work as Membership.wait sees it, done or never done: which rank of three finishes the round's
    all-reduce in its last moments is up to gloo, so the test decides it."""

    def __init__(self, done: bool):
        self.done = done

    def is_completed(self) -> bool:
        return self.done

    def wait(self) -> None:
        pass


def _one_rank_done_when_a_third_leaves(rank: int, port: int, out: str) -> None:
    """Three ranks wait for a collective. Rank 0's and rank 2's are done, rank 1's is not (it waits for rank 2's part,
    which never comes); rank 2 says so and falls asleep a second later. Then ranks 0 and 1 wait for it sent again."""
    import threading

    import torch.distributed as dist

    from auralm.training.members import Membership

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    store = dist.TCPStore("127.0.0.1", port, 3, is_master=rank == 0, wait_for_workers=False)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=3)
    m = Membership(rank, 3, lost_s=3)
    if rank == 2:
        threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGSTOP)).start()
    first = m.wait([_Work(rank != 1)], 0)
    got = {"first": first, "present": m.present, "epoch": m.epoch}
    got["again"] = m.wait([_Work(True)], m.epoch)
    with open(f"{out}.{rank}", "w") as f:
        json.dump(dict(got, seq=m.seq), f)
    if rank == 0:  # the store is this process's: kept until rank 1 is through
        wait_for(lambda: Path(f"{out}.1").exists(), 30, "rank 1's answer")
    os._exit(0)


def test_a_collective_done_on_one_rank_but_not_another_when_a_third_leaves_is_sent_again_by_both(tmp_path):
    """On three nodes or more a rank can leave in the last moments of a collective, which then ends on one rank
    present and not on another. If the first went on, the second would send it again among those present, alone:
    the next collectives would pair with the wrong ones. A collective counts as done only once every rank present has
    it done, so both send it again among themselves; on the code before, rank 0 went on at once."""
    got = _run_ranks(_one_rank_done_when_a_third_leaves, tmp_path, wait_for=(0, 1), ranks=3)
    for r in (0, 1):
        assert got[r] == {"first": False, "present": [0, 1], "epoch": 1, "again": True, "seq": 1}, (r, got)


def _many_waits(rank: int, port: int, out: str) -> None:
    """Two ranks wait for 41 collectives; rank 0 then counts the keys in the run's store (the two ranks' beats, each
    rank's word on the last collective and its outcome, the test's own two marks)."""
    import torch.distributed as dist

    from auralm.training.members import BEAT_S, Membership

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    store = dist.TCPStore("127.0.0.1", port, 2, is_master=rank == 0, wait_for_workers=False)
    base = store.num_keys()
    m = Membership(rank, 2, lost_s=30)
    done = [m.wait([_Work(True)], 0) for _ in range(41)]
    store.set(f"test/end/{rank}", "1")
    got = {"done": all(done), "seq": m.seq}
    store.wait(["test/end/0", "test/end/1"])  # both are through: the keys left are the last collective's, once
    time.sleep(2 * BEAT_S)  # each rank's beat thread has taken out the ones before
    if rank == 0:
        got["grew"] = store.num_keys() - base
    with open(f"{out}.{rank}", "w") as f:
        json.dump(got, f)
    if rank == 0:  # the store is this process's: kept until rank 1 is through
        wait_for(lambda: Path(f"{out}.1").exists(), 30, "rank 1's answer")
    os._exit(0)


def test_the_store_keeps_no_pile_of_keys_from_the_collectives_waited_for(tmp_path):
    """Every collective waited for writes its ranks' word and its outcome into the store on the master; those of the
    one before are taken out (by each rank's beat thread), or a long run would pile them up there (3 keys a collective
    for two ranks)."""
    got = _run_ranks(_many_waits, tmp_path, wait_for=(0, 1))
    assert got[0]["done"] and got[1]["done"] and got[0]["seq"] == got[1]["seq"] == 41, got
    assert got[0]["grew"] <= 7, got  # 2 beats, 2 words and 1 outcome of the last collective, the test's 2 marks
