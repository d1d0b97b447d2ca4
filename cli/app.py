"""The hrmctl command line. Each command is a thin layer over a module that holds its logic.

Parsed with the standard library's argparse, as torchrun and DeepSpeed's launcher do: typer,
used before, imports pydantic and builds a validator for every option, about 0.15 s of every
`hrmctl` process, which was half of a no-op `sync-data`.
"""

from __future__ import annotations

import argparse
import os
import sys

from cli.fast_start import defer_module

defer_module("invoke")  # paramiko needs it only for `Match exec` in ~/.ssh/config (see cli/fast_start.py)

from cli import __version__  # noqa: E402
from cli.errors import HrmctlError  # noqa: E402


class LazyConsole:
    """rich's Console, made on first use. Importing rich costs about 45 ms of every process, and a
    command writing --json to a pipe (a script's `hrmctl sync-data --json`) never needs it."""

    def __init__(self, **kwargs):
        self._kwargs, self._console = kwargs, None

    @property
    def console(self):
        if self._console is None:
            from rich.console import Console
            self._console = Console(**self._kwargs)
        return self._console

    def __getattr__(self, name: str):
        return getattr(self.console, name)

    def __enter__(self):  # rich's Live uses its console as a context manager (special names skip __getattr__)
        return self.console.__enter__()

    def __exit__(self, *exc):
        return self.console.__exit__(*exc)


out = LazyConsole()
err = LazyConsole(stderr=True)
_quick_exit = False  # set by a command whose process may end without tearing down its modules


class UsageError(HrmctlError):
    """Bad command-line usage: one line naming the command whose --help lists the options."""


class Parser(argparse.ArgumentParser):
    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)  # --dry must not pass for --dry-run next to trainer overrides
        super().__init__(*args, **kwargs)

    def error(self, message: str):  # one line, not argparse's usage block
        raise UsageError(f"{message} (see `{self.prog} --help`)")


def at_least(kind, least: float):
    """An argparse type: ``kind`` of at least ``least``."""
    def convert(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"invalid {kind.__name__} value: {text!r}") from None
        if value < least:
            raise argparse.ArgumentTypeError(f"{text} is less than the minimum of {least:g}")
        return value
    return convert


# ---------------------------------------------------------------- the commands


def cmd_nodes(a: argparse.Namespace) -> int:
    from cli.nodes.inventory import load_inventory
    from cli.nodes.view import show_nodes

    inv = load_inventory(a.inventory)
    return show_nodes(inv, inv.select(a.nodes), check=a.check, accept_new_host_keys=a.accept_new_host_keys,
                      as_json=a.json, console=out)


def cmd_doctor(a: argparse.Namespace) -> int:
    from cli.doctor.command import doctor

    return doctor(a.inventory, a.nodes, master_port=a.master_port, timeout=a.timeout, verbose=a.verbose,
                  accept_new_host_keys=a.accept_new_host_keys, as_json=a.json, console=out)


def cmd_sync_data(a: argparse.Namespace) -> int:
    from cli.nodes.inventory import load_inventory
    from cli.sync.run import sync_nodes
    from cli.sync.view import show_report

    if a.node and a.nodes:
        raise HrmctlError(f"name the nodes once: either `sync-data {a.node}` or `--nodes {a.nodes}`, not both")
    if not a.node and not a.nodes:
        raise HrmctlError("name the node to sync: `hrmctl sync-data NODE` or `--nodes node1,node2`")
    selected = load_inventory(a.inventory).select(a.node or a.nodes)
    report = sync_nodes(selected, a.src, dest=a.dest, checksum=a.checksum, delete=a.delete, dry_run=a.dry_run,
                        console=err, progress=not a.json, accept_new_host_keys=a.accept_new_host_keys,
                        stall_timeout=a.stall_timeout)
    global _quick_exit
    _quick_exit = True  # every connection is closed, nothing left to clean up: see run()
    return show_report(report, as_json=a.json, console=out, err=err)


def _launch_options(a: argparse.Namespace, module: str, args: list[str], max_restarts: int):
    from cli.launch.command import options

    return options(inventory=a.inventory, nodes=a.nodes, master_port=a.master_port, nproc=a.nproc,
                   backend=a.backend, env=a.env, max_restarts=max_restarts, dry_run=a.dry_run, run_id=a.run_id,
                   accept_new_host_keys=a.accept_new_host_keys, reprobe=a.reprobe, module=module, args=args)


def cmd_test_ddp(a: argparse.Namespace) -> int:
    from cli.launch.command import DDP_CHECK, ddp_check_args, test_ddp

    args = ddp_check_args(min_size=a.min_size, max_size=a.max_size, seconds=a.seconds, soak=a.soak,
                          no_bandwidth=a.no_bandwidth)
    return test_ddp(_launch_options(a, DDP_CHECK, args, 0), as_json=a.json, console=out, err=err)


def cmd_train(a: argparse.Namespace) -> int:
    from cli.launch.command import train

    opts = _launch_options(a, a.module, a.extra, a.max_restarts)
    return train(opts, sync_data=a.sync_data, as_json=a.json, console=out, err=err)


def _trainer_tool(module: str, prog: str):
    """A command that is one of the trainer's own tools, run as a process like every other use of auralm by
    the cli (its options, help and errors are the tool's)."""
    def command(a: argparse.Namespace) -> int:
        import subprocess

        return subprocess.call([sys.executable, "-m", module, *a.extra], env=dict(os.environ, AURALM_PROG=prog))
    return command


# ---------------------------------------------------------------- the parser


def _node_options(p: argparse.ArgumentParser, nodes_help: str) -> None:
    p.add_argument("--nodes", "-n", help=nodes_help)
    p.add_argument("--inventory", "-i",
                   help="Inventory file (default: $HRMCTL_INVENTORY, else ./hrmctl.toml).")
    p.add_argument("--accept-new-host-keys", action="store_true",
                   help="Record the host key of a node never seen before (a changed key is always refused).")
    p.add_argument("--json", action="store_true", help="Print JSON for scripts instead of a table.")


def _launch_options_args(p: argparse.ArgumentParser) -> None:
    _node_options(p, "Comma-separated node names, the master first. Default: this machine alone.")
    p.add_argument("--master-port", type=int, help="Rendezvous port on the master (default: 29500, or the next free one).")
    p.add_argument("--nproc", type=int, help="Processes per node (default: the inventory's nproc; auto = one per GPU, else 1).")
    p.add_argument("--backend", default="auto", help="auto (NCCL only if every node has CUDA+NCCL), gloo or nccl.")
    p.add_argument("--env", "-e", action="append", metavar="KEY=VALUE", help="Set on every node (repeatable).")
    p.add_argument("--dry-run", action="store_true", help="Print each node's exact command and environment; run nothing.")
    p.add_argument("--run-id", help="Name of the run (default: date-time-random).")
    p.add_argument("--reprobe", action="store_true", help="Probe torch on every node again (ignore the cached facts).")


def build_parser() -> Parser:
    nodes_help = "Comma-separated node names; the first is the master unless the inventory says otherwise."
    root = Parser(prog="hrmctl", description="Turn a few machines on one LAN into one training cluster.")
    root.add_argument("--version", action="version", version=f"hrmctl {__version__}")
    sub = root.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)

    p = sub.add_parser("nodes", help="Show every node's resolved settings and where each value came from.",
                       description="Show every node's resolved settings and where each value came from.")
    _node_options(p, nodes_help)
    p.add_argument("--check", action="store_true", help="Connect to every node in parallel and run a command there.")
    p.set_defaults(func=cmd_nodes)

    p = sub.add_parser("doctor", help="Preflight every node: reachability, ports, clocks, CUDA/NCCL, libuv, versions.",
                       description="Preflight every node: reachability, ports, clocks, CUDA/NCCL, libuv, versions, "
                                   "interfaces; a fix for every problem.")
    _node_options(p, nodes_help)
    p.add_argument("--master-port", type=int, default=29500, help="The rendezvous port to check on the master.")
    p.add_argument("--timeout", type=float, default=60.0, help="Seconds each node may take to answer the probe.")
    p.add_argument("--verbose", "-v", action="store_true", help="Full details in every cell, and interfaces.")
    p.set_defaults(func=cmd_doctor)

    p = sub.add_parser("sync-data", help="Make a node's dataset match the local one over SSH.",
                       description="Make a node's dataset match the local one over SSH: only changes, verified, "
                                   "resumable.")
    p.add_argument("node", nargs="?", help="The node to sync (or several with --nodes).")
    _node_options(p, "Comma-separated node names to sync, in parallel.")
    p.add_argument("--src", default="data", help="Local data directory to send (default: data).")
    p.add_argument("--dest", help="Directory on the node (default: the node's data_dir from the inventory).")
    p.add_argument("--checksum", "-c", action="store_true", help="Compare SHA-256 of every file, not size+mtime.")
    p.add_argument("--delete", action="store_true", help="Remove files on the node that are not in the source.")
    p.add_argument("--dry-run", action="store_true", help="List what would change; change nothing.")
    p.add_argument("--stall-timeout", type=at_least(float, 1), default=30.0,
                   help="Give up on a node that answers nothing for this many seconds (default: 30).")
    p.set_defaults(func=cmd_sync_data)

    p = sub.add_parser("test-ddp", help="A real collective across the nodes: correctness and bandwidth.",
                       description="A real collective across the nodes: correctness and bandwidth.")
    _launch_options_args(p)
    p.add_argument("--min-size", default="1KiB", help="Smallest all_reduce message (default: 1KiB).")
    p.add_argument("--max-size", default="64MiB", help="Largest all_reduce message (default: 64MiB).")
    p.add_argument("--seconds", type=float, default=0.25, help="Measuring time per message size (default: 0.25).")
    p.add_argument("--soak", type=float, default=0.0, help="Then keep checking all_reduce for this many seconds.")
    p.add_argument("--no-bandwidth", action="store_true", help="Correctness only.")
    p.set_defaults(func=cmd_test_ddp)

    p = sub.add_parser("train", help="torchrun on every node, one merged log, one Ctrl-C.",
                       usage="hrmctl train [options] [key=value ...]",
                       description="torchrun on every node, one merged log, one Ctrl-C. With no --nodes: this "
                                   "machine alone, on the default task. Trainer overrides follow as key=value "
                                   "(e.g. `hrmctl train --nodes node0,node1 training.max_steps=200`).")
    _launch_options_args(p)
    p.add_argument("--max-restarts", type=at_least(int, 0), default=0,
                   help="Restart the whole job from its last checkpoint after a failure, up to N times.")
    p.add_argument("--sync-data", action="store_true", help="Sync the local dataset to every other node first.")
    p.add_argument("--module", default="auralm.train", help="The Python module torchrun starts on every rank.")
    p.set_defaults(func=cmd_train, extra_ok=True)

    for name, module, text in (
            ("prepare-data", "auralm.data", "Turn a corpus (or generated sudoku puzzles) into training shards and a "
                                            "manifest."),
            ("eval", "auralm.evaluate", "Evaluate a checkpoint: exact and cell accuracy, halting, accuracy by "
                                        "segments."),
            ("solve", "auralm.solve", "Solve sudoku puzzles (one per line) with a trained model.")):
        p = sub.add_parser(name, add_help=False, help=text)
        p.set_defaults(func=_trainer_tool(module, f"hrmctl {name}"), extra_ok=True)
    return root


def main(argv: list[str] | None = None) -> int:
    """Entry point: every expected failure is one line on stderr and a meaningful exit code."""
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser()
    try:
        if not argv:
            parser.print_help(sys.stderr)
            return 2
        a, extra = parser.parse_known_args(argv)
        if extra and not getattr(a, "extra_ok", False):
            where = f"hrmctl {a.command}" if a.command else "hrmctl"
            raise UsageError(f"unrecognized arguments: {' '.join(extra)} (see `{where} --help`)")
        a.extra = extra
        return a.func(a)
    except HrmctlError as exc:
        err.print(f"error: {exc}", markup=False, highlight=False, soft_wrap=True)
        return exc.exit_code
    except SystemExit as exc:  # --help, --version
        return exc.code if isinstance(exc.code, int) else 0
    except KeyboardInterrupt:
        err.print("interrupted")
        return 130


def run() -> None:
    code = main()
    if _quick_exit:
        from cli.fast_start import quick_exit
        quick_exit(code)  # about 90 ms less than the interpreter's own teardown
    sys.exit(code)


if __name__ == "__main__":
    run()
