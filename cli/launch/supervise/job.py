"""The whole job, supervised: the plan run attempt after attempt (cli/launch/run/attempt.py), restarted from its last
checkpoint up to --max-restarts times after a crash or a lost node; planned again once when a first launch's guessed
torch facts were wrong on a node; under training.elastic, a node's leave and return (elastic.py) made into a new
plan for the nodes present; and the run's record (status.json: status.py) from its start to its end.
"""

from __future__ import annotations

from typing import Callable

from rich.console import Console

from cli.launch.plan.options import TRAINER
from cli.launch.plan.plan import LaunchPlan
from cli.launch.run.attempt import JOIN_CODE, LOST_CODE, RunResult, Signals, clear_node, run_once, stop_asked
from cli.launch.run.log import MergedLog
from cli.launch.supervise.elastic import Members
from cli.launch.supervise.status import ended, first_step, members_changed, started
from node.torchrun import FACTS_DIFFER


def run(prep: LaunchPlan, console: Console, replan: Callable[[dict[str, dict]], LaunchPlan]) -> RunResult:
    """Run the plan, restarting the whole job from its last checkpoint up to max_restarts times. ``replan(reported)``
    makes the plan again (the command's prepare) from what the nodes reported, when a first launch's guessed facts
    were wrong on a node. Ctrl-C, SIGTERM and SIGHUP are noted from here to the end (see Signals): none of them
    cuts the stop short. The result carries what the nodes reported (``node_facts``), for the facts' cache."""
    opts = prep.options
    run_dir = opts.runs_dir / prep.run_id
    if opts.json_output:  # stdout is for the JSON document: the live log goes to stderr
        console = Console(stderr=True)
    log = MergedLog(console, run_dir, prep.plans, quiet=opts.quiet, on_result=opts.on_result,
                    result_tag=opts.result_tag)
    plans = prep.plans
    result, attempt, error = None, 1, None
    with Signals() as signals:
        status = started(run_dir, prep)
        log.on_first_step = lambda: first_step(run_dir, status)
        try:
            log.note(f"run {prep.run_id}: {len(plans)} node(s), backend {prep.backend} ({prep.why}); logs in {run_dir}/")
            attempt, replanned, after = 1, False, ""
            members = Members.of(prep, clear_node) if opts.module == TRAINER else None  # training.elastic
            if members:
                log.note(members.said())
                members.on_change = lambda: members_changed(run_dir, status, members.events)
            ranks = {p.node.name: p.nproc for p in plans}
            while True:
                result = run_once(plans, log, signals, attempt=attempt, after=after,
                                  accept_new_host_keys=opts.accept_new_host_keys,
                                  sessions=prep.sessions, members=members)
                prep.sessions = None  # closed by run_once
                reported = result.node_facts = dict(log.node_facts)
                regrouped = _regroup(members, result, opts, ranks, replan, log,
                                     lambda: members_changed(run_dir, status, members.events))
                if regrouped:  # a node left (min_nodes allows going on) or came back: the nodes present, resumed
                    prep, plans = regrouped, regrouped.plans
                    after = "{node} {event}".format(**members.events[-1])
                    continue
                if result.code == FACTS_DIFFER and result.failed_node in reported and not replanned:
                    # a first launch's guess was wrong on that node (nothing ran there): plan again from
                    # what it reported (now cached), once; this is not a restart
                    log.note(f"planning again with {result.failed_node}'s answers")
                    prep = replan(reported)
                    plans, replanned = prep.plans, True
                    log.note(f"backend {prep.backend} ({prep.why})")
                    continue
                if result.code == 0 or result.interrupted or attempt > opts.max_restarts:
                    break
                if result.no_restart:  # a stop a restart cannot fix: only crashes and lost nodes are restarted
                    log.note(f"no restart ({attempt - 1} of {opts.max_restarts} made): {result.no_restart}")
                    break
                asked = stop_asked(signals, log)
                if asked:  # asked while this attempt's failure was being stopped: no restart
                    result.reason += f"; no restart ({asked.reason})"
                    break
                attempt += 1
                log.note(f"{result.reason}; restart {attempt - 1} of {opts.max_restarts} from the last checkpoint")
                if opts.module == TRAINER:  # same arguments (out_dir too), resuming from the run's last checkpoint
                    plans = [p.resumed() for p in plans]
            return result
        except BaseException as exc:
            error = exc
            raise
        finally:
            if members:
                members.close()
            ended(run_dir, status, result, attempt, error)
            log.close()


def _regroup(members: Members | None, result: RunResult, opts, ranks: dict[str, int], replan, log: MergedLog,
             record: Callable[[], None]) -> LaunchPlan | None:
    """The plan for the nodes present now when a node left and min_nodes lets the run go on without it, or when a
    node that left is back (cli/launch/supervise/elastic.py); None otherwise. ``record()`` writes the leave or join
    down."""
    if members is None:
        return None
    if result.code == JOIN_CODE:
        members.join(result.failed_node, log)
    elif (result.code == LOST_CODE or result.killed) and members.can_go_on_without(result.failed_node):
        members.leave(result.failed_node, result.reason, log)
    else:
        return None
    record()
    return members.plan_present(lambda now, args: replan(result.node_facts, now, args), opts.args, ranks, log, record)
