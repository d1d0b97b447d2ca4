"""One attempt of a plan: torchrun on every node at once, watch them, and stop everything everywhere (the attempts
and restarts of a whole job: cli/launch/supervise/job.py).

One stop: the first node whose job ends with a non-zero code, a node whose SSH connection or
keep-alive is lost, Ctrl-C (SIGINT), SIGTERM, SIGHUP, or the output's reader gone (a pipe's reader
exited: taken as a closed terminal), stops the job on every node. A stop asked for (a signal, the reader
gone) ends with exit code 128 + the signal: 130 Ctrl-C, 143 SIGTERM, 129 SIGHUP, 141 the reader gone (what
SIGPIPE would give), the run recorded as stopped, and the nodes' lines from then on in their files only
(what they print while being stopped, torchrun's SignalException traceback among it, is not for the
screen). Stopping is two-fold:
  1. the job's channel is closed: an SSH job runs on a PTY, so the node's sshd hangs up the
     torchrun agent (SIGHUP), and torchrun terminates its workers; a local job's process group
     gets SIGTERM;
  2. an explicit stop on every node, over a fresh connection: every process whose environment
     carries this job's HRMCTL_JOB tag (set by the launcher and inherited by torchrun and all its
     workers, which torchrun starts in sessions of their own, so no process group holds them all)
     and their descendants get SIGTERM, and SIGKILL after a grace period (psutil, run by the node's
     Python: process_iter over the environments, children(recursive=True), wait_procs). Processes
     are found by PID through that tag, never by name, so nothing else of the user's is touched.
"""

from __future__ import annotations

import dataclasses
import signal
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Protocol

from auralm.errors import BAD_INPUT_EXIT
from cli.launch.plan.plan import NodeLaunch
from cli.launch.run.log import MergedLog, signal_name
from cli.launch.run.lost import what_was_seen
from cli.launch.run.oom import OomCounts
from cli.launch.run.save_stop import save_then_wait, saves_first
from cli.nodes.remote import Job, Session, connect_all, for_each
from node.lines import last
from node.ship import program
from node.torchrun import FACTS_DIFFER

KEEPALIVE_S = 2.0
HEARTBEAT_TIMEOUT_S = 8.0
SETTLE_S = 1.5  # after the hang-up, what the job's processes get to end by themselves before the stop's SIGTERM
TERM_GRACE_S = 3.0  # after the SIGTERM, before the SIGKILL
POLL_S = 0.1
LOST_CODE = 255
JOIN_CODE = 254  # run_once's result when a node that left is back: not a failure, the run re-forms with it
OUTPUT_GONE_CODE = 128 + signal.SIGPIPE  # 141: what a program killed by SIGPIPE (writing to a closed pipe) gives
REPORT_WINDOW_S = 1.5

@dataclass
class RunResult:
    code: int
    reason: str = ""
    failed_node: str | None = None
    failed_rank: int | None = None
    interrupted: bool = False
    left_running: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    from_trainer: bool = False  # the reason is the trainer's own line (auralm.errors.STOP_TAG)
    no_restart: str = ""  # why a restart cannot fix this failure ("": a crash or a lost node, which one may)
    killed: bool = False  # the failed node's rank or torchrun died of a signal (not the OOM killer's)
    node_facts: dict[str, dict] = field(default_factory=dict)  # what nodes said of their torch (node/torchrun.py)


class Membership(Protocol):
    """What an attempt asks of a run whose nodes may leave and come back (training.elastic): the Members of
    cli/launch/supervise/elastic.py, which the later stage makes and hands in."""

    def returned(self) -> str | None:
        """A node that left and answers again, if any."""

    def leaves_in_place(self, name: str, lost: bool, why: str, log) -> bool:
        """Whether node ``name`` leaves while the others' ranks go on without it (noted as left if so)."""


class Signals:
    """Ctrl-C, SIGTERM and SIGHUP noted, not raised. An exception raised wherever the main thread
    happens to be can leave a lock held (one inside paramiko's Event.wait, say), and the stop after
    it would then wait on that lock for ever; so the wait loop looks at `got` every POLL_S instead.
    Signals during the stop are noted too, so a second Ctrl-C cannot cut it short."""

    WATCHED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1)  # USR1: Slurm's time-limit warning

    def __init__(self) -> None:
        self.got: int | None = None

    def __enter__(self) -> "Signals":
        self.old = {s: signal.signal(s, self._note) for s in self.WATCHED}
        return self

    def _note(self, signum, frame) -> None:
        self.got = self.got or signum

    def __exit__(self, *exc) -> None:
        for s, h in self.old.items():
            signal.signal(s, h)

    def result(self) -> RunResult:
        why = "interrupted (Ctrl-C)" if self.got == signal.SIGINT else f"stopped by {signal_name(self.got)}"
        return RunResult(128 + self.got, why, interrupted=True)


def stop_asked(signals: Signals, log: MergedLog) -> RunResult | None:
    """A stop someone asked for: a signal (first), or the output's reader gone (taken as a closed terminal)."""
    if signals.got:
        return signals.result()
    gone = log.output_gone()
    return RunResult(OUTPUT_GONE_CODE, f"stopped: {gone}", interrupted=True) if gone else None


def stop_everywhere(plans: list[NodeLaunch], jobs: dict[str, Job], accept_new_host_keys: bool) -> dict[str, int]:
    """Hang up every job and kill what is left of it on every node; {node: processes still alive}."""
    for job in jobs.values():
        job.stop()
    by_name = {p.node.name: p for p in plans}

    def kill(session: Session) -> int:
        return stop_tagged(session, by_name[session.node.name].env["HRMCTL_JOB"], settle=SETTLE_S)

    left = {}
    for o in for_each([p.node for p in plans], kill, accept_new_host_keys=accept_new_host_keys, connect_timeout=4):
        left[o.node.name] = o.value if o.ok else -1
    deadline = time.monotonic() + 2  # the jobs' last lines: 2 s for all of them, not each
    for job in jobs.values():
        job.wait(max(0.0, deadline - time.monotonic()))
    return left


def stop_tagged(session: Session, tag: str, settle: float = 0.0) -> int:
    """The stop of the job tagged ``tag`` on the node (node/jobs.py: ``settle`` s for its processes to end by
    themselves first, then SIGTERM, then SIGKILL after TERM_GRACE_S): how many of them are left, -1 when the node
    could not say."""
    res = session.run_python(program("jobs"), ["stop", tag, str(TERM_GRACE_S), str(settle)],
                             timeout=settle + TERM_GRACE_S + 6)
    left = (last(res.stdout) or {}).get("left") if res.ok else None
    return left if isinstance(left, int) else -1


def clear_node(session: Session, tag: str) -> bool:
    """What is left on a node of the job tagged ``tag`` stopped (a node that left the run, answering again):
    whether the node ran the stop and nothing of it is left."""
    return stop_tagged(session, tag) == 0


class _KeepAlive(threading.Thread):
    """An SSH-level keep-alive request (`keepalive@openssh.com`, answered by sshd itself, so no
    process is started on the node) every KEEPALIVE_S; `silent_for()` is how long the node has
    not answered. The request blocks while the network is gone, hence the separate thread."""

    def __init__(self, session: Session):
        super().__init__(daemon=True)
        self.transport = session.client.get_transport()
        self.last = time.monotonic()
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.wait(KEEPALIVE_S):
            t = self.transport
            if t is None or not t.is_active():
                return
            try:
                t.global_request("keepalive@openssh.com", wait=True)  # any answer, even "unsupported", will do
            except Exception:
                return
            if t.is_active():
                self.last = time.monotonic()

    def silent_for(self) -> float:
        return time.monotonic() - self.last


def run_once(plans: list[NodeLaunch], log: MergedLog, signals: Signals, *, attempt: int = 1, after: str = "",
             accept_new_host_keys: bool = False, sessions: dict[str, Session] | None = None,
             members: Membership | None = None) -> RunResult:
    """Start every node's command, wait, and stop everything on the first failure or a stop asked for (see
    stop_asked). `sessions` (one per node, closed here) are the preflight's; without them, new ones are made.
    ``members`` (Membership): a node that left the run and answers again (``members.returned()``): the
    ranks save, and the job stops with JOIN_CODE, to be started again with it; a node that leaves a run whose ranks
    go on without it (``members.in_place``) is noted, and the others' jobs are left running."""
    t0 = time.monotonic()
    sessions = sessions or connect_all([p.node for p in plans], accept_new_host_keys)
    jobs: dict[str, Job] = {}
    beats: dict[str, _KeepAlive] = {}
    result: RunResult | None = None
    try:
        result = stop_asked(signals, log)  # asked before anything started: nothing starts
        if result is None:
            log.start(plans, attempt, after)
            for p in plans:
                session = sessions[p.node.name]
                ssh = p.node.reached_by == "ssh"  # srun's nodes are watched by Slurm: a lost node fails the step
                jobs[p.node.name] = session.start(p.argv, log.handler(p), env=p.env, cwd=p.cwd, pty=ssh)
                if ssh:
                    beats[p.node.name] = _KeepAlive(session)
            for b in beats.values():
                b.start()
            ooms = OomCounts(sessions, [p.node.name for p in plans],
                             machine={p.node.name for p in plans if p.node.reached_by == "srun"})
            result = _watch(plans, log, signals, jobs, beats, ooms,
                            lambda plan: what_was_seen(plan, accept_new_host_keys), members)
            if result.interrupted and saves_first(signals.got, plans):  # Slurm's time limit, requeue: save first
                save_then_wait(signals.got, plans, jobs, log, accept_new_host_keys)
            elif result.code == JOIN_CODE:  # a node is back: a checkpoint of this step, which every rank resumes
                save_then_wait(signal.SIGUSR1, plans, jobs, log, accept_new_host_keys,
                               saved=lambda: log.saved_on_request)
    finally:
        for b in beats.values():
            b.halt.set()
        if result is None or result.code != 0:
            if result is not None and result.interrupted:
                log.hush()  # what the nodes print while being stopped goes to their files only
            why = result.reason if result else "stopping"
            if result is not None and result.from_trainer:  # its line is on the screen already: not twice more
                why = f"rank {result.failed_rank} on {result.failed_node} stopped (its error line above)"
            log.note(f"{why}: stopping the job on every node")
            result = result or RunResult(1, "launcher error")
            result.left_running = stop_everywhere(plans, jobs, accept_new_host_keys) if jobs else {}
            if result.code == OUTPUT_GONE_CODE and signals.got:  # Ctrl-C to a pipeline: its reader went too
                result = dataclasses.replace(signals.result(), left_running=result.left_running)
            log.flush()
            if result.interrupted:
                log.note(f"{result.reason}: {stopped_where(result)}", show=False)
        for s in sessions.values():
            s.close()
    result.seconds = time.monotonic() - t0
    return result


def _watch(plans: list[NodeLaunch], log: MergedLog, signals: Signals, jobs: dict[str, Job],
           beats: dict[str, "_KeepAlive"], ooms: "OomCounts", seen: Callable[[NodeLaunch], str],
           members: Membership | None = None) -> RunResult:
    """Wait for every node's job: the first failure, lost node or stop asked for is the result. A lost node (no
    keep-alive reply for HEARTBEAT_TIMEOUT_S, or its job's connection broken) is named with what ``seen(plan)``
    finds there (cli/launch/run/lost.py: its link down, its processes frozen or gone). Under ``members.in_place`` a
    node that may leave is noted as left and the watch goes on with the others (their ranks go on without it)."""
    ended: dict[str, int] = {}

    def gone(result: RunResult) -> RunResult | None:  # the result, unless the node left and the others go on
        if members is not None and members.leaves_in_place(result.failed_node, result.code == LOST_CODE or
                                                            result.killed, result.reason, log):
            beats.pop(result.failed_node, None)
            ended.setdefault(result.failed_node, LOST_CODE)
            return None
        return result

    while True:
        asked = stop_asked(signals, log)
        if asked:
            return asked
        for p in plans:
            name = p.node.name
            if name in ended:
                continue
            code = jobs[name].wait(0)
            if code is not None:
                ended[name] = code
                if code != 0:
                    result = gone(_lost(plans, log, name, "its SSH connection broke", seen)
                                  if jobs[name].connection_lost() else _failure(plans, log, jobs, ended, name, ooms))
                    if result is not None:
                        return result
        if len(ended) == len(plans):
            return RunResult(0, "every node finished")
        back = members.returned() if members and log.stepped else None  # the ranks present step: they can save
        if back:
            return RunResult(JOIN_CODE, f"{back} answers again", failed_node=back)
        silent = [n for n, b in beats.items() if n not in ended and b.silent_for() > HEARTBEAT_TIMEOUT_S]
        if silent:
            name = silent[0]
            result = gone(_lost(plans, log, name, f"no SSH keep-alive reply for {beats[name].silent_for():.0f}s",
                                seen))
            if result is not None:
                return result
        time.sleep(POLL_S)


def _lost(plans: list[NodeLaunch], log: MergedLog, name: str, how: str, seen: Callable[[NodeLaunch], str]) -> RunResult:
    """A node lost: said at once, then what a fresh look at it found (a few seconds), as the run's reason."""
    log.note(f"{name} stopped answering ({how}); looking at it")
    plan = _plan(plans, name)
    return RunResult(LOST_CODE, f"{name} stopped answering ({how}): {seen(plan)}", failed_node=name,
                     failed_rank=plan.first_rank)


def _plan(plans: list[NodeLaunch], name: str) -> NodeLaunch:
    return next(p for p in plans if p.node.name == name)


def _failure(plans: list[NodeLaunch], log: MergedLog, jobs: dict[str, Job], ended: dict[str, int],
             first: str, ooms: OomCounts | None = None) -> RunResult:
    """Who failed first. When one rank dies, its peers fail a moment later on a broken connection,
    and may end before the killed rank's node has reported; so the other nodes get up to
    REPORT_WINDOW_S to end too (less once a killed worker has shown up, or everyone has ended), and a
    worker killed by a signal (torchrun's report: a negative exit code) is the root cause over one
    that exited on a broken connection; otherwise the first node to end. The rank comes from
    torchrun's "Root Cause" report; a rank killed by a signal is named with it (SIGKILL: the OOM
    killer's, so the message says where to look)."""
    deadline = time.monotonic() + REPORT_WINDOW_S
    while time.monotonic() < deadline:
        for p in plans:
            if p.node.name not in ended:
                code = jobs[p.node.name].wait(0)
                if code is not None:
                    ended[p.node.name] = code
        if any(c and log.exitcode.get(n, 0) < 0 for n, c in ended.items()):
            break  # a killed worker: the root cause is known
        if len(ended) == len(plans) and all(n in log.failed_rank for n, c in ended.items() if c):
            break  # everyone has ended and reported
        time.sleep(0.05)
    failed = [n for n, c in ended.items() if c]  # in the order they ended
    killed = [n for n in failed if log.exitcode.get(n, 0) < 0]
    name = (killed or [first])[0]
    code = ended[name]
    plan = _plan(plans, name)
    rank = log.failed_rank.get(name, plan.first_rank if plan.nproc == 1 else None)
    who = f"rank {rank}" if rank is not None else f"ranks {plan.ranks.start}-{plan.ranks.stop - 1}"
    if code == FACTS_DIFFER and name in log.node_facts:  # node/torchrun.py: nothing ran there
        return RunResult(code, f"{name}: its torch differs from the first launch's guess", failed_node=name)
    worker_code = log.exitcode.get(name)
    if worker_code is not None and worker_code < 0:  # torchrun's report: the rank died of a signal
        oom = -worker_code == signal.SIGKILL and ooms is not None and ooms.grew(name)
        return RunResult(code, killed_by(f"{who} on {name}", name, -worker_code, oom), failed_node=name,
                         failed_rank=rank, no_restart=OOM_NOT_FIXED if oom else "", killed=not oom)
    if code < 0:  # the node's job itself (a local torchrun) died of a signal: exit as a shell would
        oom = -code == signal.SIGKILL and ooms is not None and ooms.grew(name)
        return RunResult(128 - code, killed_by(f"torchrun on {name} ({who})", name, -code, oom), failed_node=name,
                         failed_rank=rank, no_restart=OOM_NOT_FIXED if oom else "", killed=not oom)
    stop = log.stop_reason(name, rank)
    if stop is not None:  # the trainer said why, in one line: that is the reason
        node, doc = stop
        said_rank = doc.get("rank") if isinstance(doc.get("rank"), int) else rank
        return RunResult(code, doc["reason"], failed_node=node, failed_rank=said_rank, from_trainer=True,
                         no_restart=NOT_FIXED_BY_RESTART)
    detail = f", worker exit code {worker_code}" if worker_code not in (None, code) else ""
    return RunResult(code, f"{who} on {name} failed first (exit code {code}{detail})", failed_node=name,
                     failed_rank=rank, no_restart=NOT_FIXED_BY_RESTART if worker_code == BAD_INPUT_EXIT else "")


NOT_FIXED_BY_RESTART = (f"the trainer stopped with exit code {BAD_INPUT_EXIT}: bad input, or a run that cannot learn or "
                        f"does not fit in memory; a restart would stop the same way")
OOM_NOT_FIXED = "the same run would run out of memory again"


def killed_by(who: str, node: str, signum: int, oom: bool = False) -> str:
    """`rank 1 on node1 was killed by SIGKILL (out of memory? ...)`: SIGKILL is what the kernel's OOM killer sends.
    ``oom``: the node's OOM-kill count grew meanwhile, so it was the OOM killer: the message says so."""
    if oom:
        return (f"{who} was killed by {signal_name(signum)}: {node} ran out of memory (the kernel's OOM killer; "
                f"lower training.batch_size, or use training.batch_size=auto, the largest that fits, or "
                f"training.grad_checkpoint=true)")
    hint = f" (out of memory? see `dmesg` on {node})" if signum == signal.SIGKILL else ""
    return f"{who} was killed by {signal_name(signum)}{hint}"


def stopped_where(result: RunResult) -> str:
    """`every node stopped`, or the nodes where the stop could not be confirmed."""
    left = {n: c for n, c in result.left_running.items() if c}
    if not left:
        return "every node stopped"
    return "could not confirm the stop on " + ", ".join(
        f"{n} ({'unreachable' if c < 0 else f'{c} processes left'})" for n, c in left.items())


def summary_line(result: RunResult) -> str:
    """The run's last line: `stopped by SIGTERM: every node stopped after 12.3s` for a stop asked for, else the
    reason, and the nodes where a stop could not be confirmed."""
    if result.interrupted:
        return f"{result.reason}: {stopped_where(result)} after {result.seconds:.1f}s"
    left = any(result.left_running.values())
    if result.from_trainer:  # the trainer's own line, then where and when
        where = f"rank {result.failed_rank} on {result.failed_node}, " if result.failed_rank is not None else ""
        return f"{result.reason} ({where}after {result.seconds:.1f}s)" + (f"; {stopped_where(result)}" if left else "")
    return f"{result.reason} after {result.seconds:.1f}s" + (f"; {stopped_where(result)}" if left else "")
