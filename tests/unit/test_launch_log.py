"""The merged log when nobody reads it any more, and torchrun's SignalException traceback (cli/launch/run/log.py)."""

from __future__ import annotations

import os

from rich.console import Console

from cli.launch.run.log import MergedLog, reader_gone
from tests.unit.test_launch_plan import node, plan
from cli.launch.plan.plan import NodeFacts

# what torchrun's agent prints when it is stopped by a signal (Python 3.11, torch 2.13)
SIGNAL_TRACEBACK = """Traceback (most recent call last):
  File "<frozen runpy>", line 198, in _run_module_as_main
  File "/w/torch/distributed/run.py", line 990, in main
    run(args)
  File "/w/torch/distributed/elastic/multiprocessing/api.py", line 86, in _terminate_process_handler
    raise SignalException(f"Process {os.getpid()} got signal: {sigval}", sigval=sigval)
torch.distributed.elastic.multiprocessing.api.SignalException: Process 4242 got signal: 1"""
# torchrun's log tailer when a second signal comes during its stop: its logger's note, then the chained tracebacks,
# every line with the logger's prefix
P = "E1126 10:33:30.384000 10266 torch/distributed/elastic/multiprocessing/tail_log.py:154] "
LOGGED_CHAIN = "\n".join(P + line for line in [
    "error in log tailer for default0. SignalException", *SIGNAL_TRACEBACK.replace(": 1", ": 15").splitlines(), "",
    "During handling of the above exception, another exception occurred:", "",
    *SIGNAL_TRACEBACK.replace(": 1", ": 15").splitlines(), ""])
OTHER_TRACEBACK = """Traceback (most recent call last):
  File "/w/auralm/training/train.py", line 10, in main
    step()
RuntimeError: Connection closed by peer"""


def one_node_log(tmp_path, console: Console) -> MergedLog:
    plans = plan(nodes=[node("a", "10.0.0.1")], facts={"a": NodeFacts(cpus=2)})
    log = MergedLog(console, tmp_path, plans)
    log.start(plans, 1)
    return log


def test_torchruns_signal_traceback_is_one_line_in_the_file_and_none_on_screen_other_tracebacks_go_on(tmp_path):
    screen = tmp_path / "screen.txt"
    with open(screen, "w") as fh:
        log = one_node_log(tmp_path, Console(file=fh, width=200, color_system=None))
        log.line("a", 0, "before")
        for line in [*SIGNAL_TRACEBACK.splitlines(), *LOGGED_CHAIN.splitlines()]:
            log.line("a", None, line)
        for line in OTHER_TRACEBACK.splitlines():  # a rank's own traceback: kept whole, in its order
            log.line("a", 0, f"[rank0]:{line}")
        log.line("a", 0, "Traceback (most recent call last):")  # cut short: its process ended mid-way
        log.close()
    shown, kept = screen.read_text(), (tmp_path / "a.log").read_text()
    assert "SignalException" not in shown + kept and "_terminate_process_handler" not in shown + kept
    assert kept.count("# hrmctl: torchrun ended on SIGHUP (the stop's tracebacks left out)") == 1
    assert "During handling" not in shown + kept and P not in kept, kept
    rank0 = [line.split("│ ", 1)[1] for line in shown.splitlines() if "│ " in line]
    assert rank0 == ["before", *OTHER_TRACEBACK.splitlines(), "Traceback (most recent call last):"], shown
    assert [line.split(" ", 1)[1] for line in kept.splitlines() if line.startswith(("0", "1", "2"))] == [
        "before", *(f"[rank0]:{line}" for line in OTHER_TRACEBACK.splitlines()),
        "Traceback (most recent call last):"]


def test_a_reader_gone_stops_the_screen_not_the_file(tmp_path):
    """A pipe whose reader exited (`| head -5` after five lines): poll sees it before any write, a write that
    fails (EPIPE) says it too; the output goes to /dev/null and the file keeps every line."""
    read, write = os.pipe()
    out = os.fdopen(write, "w", buffering=1)
    log = one_node_log(tmp_path, Console(file=out, width=200))
    log.line("a", 0, "[rank0]:step 1/9")
    assert os.read(read, 4096).decode().rstrip().endswith("step 1/9") and log.output_gone() is None
    os.close(read)
    assert reader_gone(out)
    log.line("a", 0, "[rank0]:step 2/9")  # EPIPE: no exception, the line still kept
    assert log.gone and "taken as a closed terminal" in log.gone
    assert not reader_gone(out)  # now /dev/null: what is still written goes nowhere, without an error
    log.note("stopped: every node stopped")
    log.line("a", 0, "[rank0]:step 3/9")
    log.close()
    kept = (tmp_path / "a.log").read_text()
    assert "step 2/9" in kept and "step 3/9" in kept and "# hrmctl: stopped: every node stopped" in kept
    out.close()


def test_a_file_or_devnull_always_has_a_reader(tmp_path):
    with open(os.devnull, "w") as null, open(tmp_path / "f", "w") as f:
        assert not reader_gone(null) and not reader_gone(f) and not reader_gone(None)


def test_rank_0s_line_that_the_checkpoint_asked_for_by_sigusr1_is_written_is_seen_and_no_other(tmp_path):
    """A rejoin's agreed save (cli/launch/run/attempt.py) waits until rank 0 says its checkpoint is written, not for
    each node's torchrun to end (whose exit barrier waits 10 s for the agent of a node that left): the line MergedLog
    knows is the one the trainer prints (auralm.training.stop_request.stop_line)."""
    import signal

    from auralm.training.stop_request import stop_line

    plans = plan(nodes=[node("a", "10.0.0.1"), node("b", "10.0.0.2")], facts={"a": NodeFacts(cpus=2),
                                                                               "b": NodeFacts(cpus=2)})
    log = MergedLog(Console(file=open(os.devnull, "w")), tmp_path, plans)
    log.start(plans, 1)
    saved = stop_line(signal.SIGUSR1, 192, 700, tmp_path / "a run" / "checkpoint-192")
    log.line("b", 1, saved)  # node b's one rank, rank 1, says it too: not rank 0's
    log.line("a", 0, stop_line(signal.SIGTERM, 192, 700, "runs/x/checkpoint-192"))  # Slurm's SIGTERM: not asked here
    log.line("a", 0, "stopped at step 192/700 on SIGUSR1: checkpoint")  # cut short
    assert not log.saved_on_request
    log.line("a", 0, saved)
    assert log.saved_on_request
    log.start(plans, 2)  # the next attempt starts without it
    assert not log.saved_on_request
    log.close()


def test_c10ds_warning_of_no_reverse_dns_is_in_the_nodes_file_not_on_the_screen(tmp_path):
    """torch prints it at each connection of every launch whose peer address has no name (no reverse DNS, as on the
    lab's and most home networks): harmless, so the screen leaves it out; any other warning of torch's is shown."""
    warning = ("[W1128 22:16:29.441969074 socket.cpp:207] [c10d] The hostname of the client socket cannot be "
               "retrieved. err=-3")
    other = "[W1128 22:16:30.000000000 socket.cpp:469] [c10d] waitForInput: poll for socket returned 0"
    screen = tmp_path / "screen.txt"
    with open(screen, "w") as fh:
        log = one_node_log(tmp_path, Console(file=fh, width=300, color_system=None))
        for line in (warning, f"[rank0]:{warning}", other, "[rank0]:step 1/2 | loss 2.3"):
            log.line("a", 0, line)
        log.close()
    shown, kept = screen.read_text(), (tmp_path / "a.log").read_text()
    assert "hostname of the client socket" not in shown and kept.count("hostname of the client socket") == 2, kept
    assert "waitForInput" in shown and "step 1/2 | loss 2.3" in shown, shown


# what torchrun prints when a worker failed (torch 2.13, through hrmctl's node wrapper): its traceback, then its report
CHILD_FAILED = """Traceback (most recent call last):
  File "<frozen runpy>", line 198, in _run_module_as_main
  File "/w/cli/launch/node_torchrun.py", line 149, in main
    torchrun(rest)
  File "/w/torch/distributed/launcher/api.py", line 383, in launch_agent
    raise ChildFailedError(
torch.distributed.elastic.multiprocessing.errors.ChildFailedError: 
============================================================
auralm.training.train FAILED
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-12-02_06:04:25
  host      : localhost
  rank      : 0 (local_rank: 0)
  exitcode  : 2 (pid: 25535) 
  error_file: <N/A>
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
============================================================"""


def test_after_the_trainers_stop_line_torchruns_traceback_is_one_line_in_the_file_and_its_report_is_read(tmp_path):
    """Issue 63, item 5: a rank's failure said in the trainer's one line (a full disk) is followed by torchrun's
    ChildFailedError traceback; neither the screen nor the node's file (what `hrmctl logs` merges) holds it, torchrun's
    report of the ranks stays in the file and still names the rank that failed first. Without the trainer's line
    the traceback is kept, as it came."""
    import json

    from auralm.errors import STOP_TAG

    stop = "rank 0: cannot write runs/x/checkpoint-8: no space left on device; free space there; then rerun"
    for said in (True, False):
        screen = tmp_path / f"screen-{said}.txt"
        with open(screen, "w") as fh:
            log = one_node_log(tmp_path / str(said), Console(file=fh, width=300, color_system=None))
            if said:
                log.line("a", 0, f"[rank0]:error: {stop}")
                log.line("a", 0, f"[rank0]:{STOP_TAG}{json.dumps({'reason': stop, 'rank': 0, 'exit_code': 2})}")
            for line in CHILD_FAILED.splitlines():
                log.line("a", None, line)
            log.close()
        shown, kept = screen.read_text(), (tmp_path / str(said) / "a.log").read_text()
        assert log.failed_rank == {"a": 0} and log.exitcode == {"a": 2}
        assert "Root Cause (first observed failure)" in kept
        if said:
            assert "Traceback (most recent call last)" not in shown + kept and "launch_agent" not in kept, kept
            assert "ChildFailedError traceback left out" in kept and "Root Cause" not in shown
            assert log.stop_reason("a", 0)[1]["reason"] == stop
        else:
            assert "Traceback (most recent call last)" in kept and "ChildFailedError: " in kept
