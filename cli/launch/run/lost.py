"""What a node that stopped answering shows, said in one phrase for the run's log and its reason.

The launcher's keep-alive is an SSH request to every node every 2 s (cli/launch/run/attempt.py: _KeepAlive); a node that
has not answered for 8 s, or whose job's SSH connection broke, is lost. Then, over a fresh connection, within a few
seconds, hrmctl looks at what is there:

  - no TCP answer from its sshd within CONNECT_S: its link is down (or it sleeps, or it is off: from here the same);
  - a TCP answer (the kernel's) but no SSH greeting within CONNECT_S: every process there is frozen, sshd too (asleep);
  - its sshd answers, and the job's processes (found by their HRMCTL_JOB tag, as the stop finds them) are stopped:
    they are frozen (SIGSTOP, or a machine that sleeps while its network card still answers);
  - none of the job's processes is left: they are gone (killed, the OOM killer, the machine restarted);
  - they run: its SSH session stopped answering while the job runs (the session's own sshd process stopped).
"""

from __future__ import annotations

import socket

from cli.launch.plan.plan import NodeLaunch
from cli.nodes.remote import for_each
from node.lines import last
from node.ship import program

CONNECT_S = 4.0
LOOK_S = 8.0  # the node's Python and psutil over the whole process table

def link_answers(plan: NodeLaunch) -> str | None:
    """None when the node's sshd greets a TCP connection within CONNECT_S, else what happened instead: no TCP answer
    (the link), or a connection the kernel took but no SSH greeting on it (every process frozen: asleep)."""
    node = plan.node
    if node.proxy_command:  # reached through another host: the SSH attempt below says it
        return None
    try:
        with socket.create_connection((node.host, node.port), timeout=CONNECT_S) as sock:
            try:
                sock.recv(4)  # sshd sends its version line first
                return None
            except socket.timeout:
                return (f"it is asleep or frozen ({node.host}:{node.port} takes the connection but its sshd says "
                        f"nothing within {CONNECT_S:g}s)")
    except socket.timeout:
        down = f"no answer from {node.host}:{node.port} within {CONNECT_S:g}s"
    except OSError as exc:
        down = f"{node.host}:{node.port}: {exc.strerror or exc}"
    return f"its link is down ({down}: off the network, asleep or powered off)"


def what_was_seen(plan: NodeLaunch, accept_new_host_keys: bool = False) -> str:
    """One phrase: the node's link down, the node asleep, its job's processes frozen, gone, or running without an
    answering session."""
    down = link_answers(plan)
    if down:
        return down
    tag = plan.env["HRMCTL_JOB"]
    outcome = for_each([plan.node], lambda s: s.run_python(program("jobs"), ["states", tag], timeout=LOOK_S),
                       accept_new_host_keys=accept_new_host_keys, connect_timeout=CONNECT_S)[0]
    res = outcome.value if outcome.ok else None
    states = (last(res.stdout) or {}).get("states") if res is not None and res.ok else None
    if not isinstance(states, dict):
        why = outcome.error or (res.stderr.strip().splitlines() or ["no answer"])[-1] if res is not None else outcome.error
        return f"its sshd takes connections but its processes could not be looked at ({why})"
    total = sum(states.values())
    if total == 0:
        return "its processes are gone (none of the job's processes is left on it: killed, or the machine restarted)"
    stopped = states.get("stopped", 0) + states.get("tracing-stop", 0)
    if stopped:
        return (f"its processes are frozen ({stopped} of the job's {total} processes stopped, as a sleeping machine's; "
                f"SIGSTOP)")
    return f"its {total} job processes run, but its SSH session stopped answering"
