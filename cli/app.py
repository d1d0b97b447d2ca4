"""The hrmctl command line (Typer). Each command is a function with type hints and help text; its body
imports the room that holds its logic (cli/nodes, cli/setup, cli/doctor, cli/top, cli/sync, cli/launch, cli/runs;
the trainer's tools: auralm, through cli/tools) only when it runs, so `hrmctl --help` imports typer and rich but never
paramiko, torch or the rooms, and of auralm only the standard-library tables prepare-data's options list
(auralm/data/prepare_choices.py; checked with `python -X importtime`), and `sync-data` never imports torch, the rest
of auralm or the other rooms.

Every expected failure is one line on stderr (`error: ...`) and an exit code from the README's table:
0 done, 1 a check or a node failed, 2 bad input, 3 a node unreachable or refused us, 130 interrupted.
"""

from __future__ import annotations

import functools
import os
import signal
import sys
from typing import Annotated, Optional

import typer

from cli.fast_start import defer_module

defer_module("invoke")  # paramiko needs it only for `Match exec` in ~/.ssh/config (see cli/fast_start.py)

from cli import __version__  # noqa: E402
from cli.errors import HrmctlError  # noqa: E402


class LazyConsole:
    """rich's Console, made on first use: a command writing --json to a pipe (a script's
    `hrmctl sync-data --json`) never needs it."""

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
_argv: list[str] = []  # hrmctl's arguments, as main() got them: what `train --detach` gives its supervisor
_quick_exit = False  # set by a command whose process may end without tearing down its modules

app = typer.Typer(name="hrmctl", help="Turn a few machines on one LAN into one training cluster.",
                  no_args_is_help=False, pretty_exceptions_enable=False, rich_markup_mode="rich",
                  context_settings={"help_option_names": ["--help", "-h"]})


def command(name: str, **kwargs):
    """``app.command``, and Ctrl-C inside the command is the line `interrupted` and exit code 130."""
    def register(fn):
        @functools.wraps(fn)
        def body(*args, **kw):
            try:
                return fn(*args, **kw)
            except KeyboardInterrupt:
                err.print("interrupted")
                return 130
        return app.command(name, **kwargs)(body)
    return register


def _version(value: bool) -> None:
    if value:
        print(f"hrmctl {__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                                help="Print the version and exit.")] = False) -> None:
    """Turn a few machines on one LAN into one training cluster."""


# ---------------------------------------------------------------- options shared by several commands

NODES = "Nodes"
LAUNCH = "Launch"
SLURM = "Slurm (with --slurm)"


def SlurmInt(flag: str, text: str):
    return Annotated[Optional[int], typer.Option(flag, min=1, rich_help_panel=SLURM, help=text, show_default=False)]


def SlurmText(flag: str, text: str):
    return Annotated[Optional[str], typer.Option(flag, rich_help_panel=SLURM, help=text, show_default=False)]
Nodes = Annotated[Optional[str], typer.Option(
    "--nodes", "-n", rich_help_panel=NODES,
    help="Comma-separated node names; the first is the master unless the inventory says otherwise.")]
Inventory = Annotated[Optional[str], typer.Option(
    "--inventory", "-i", rich_help_panel=NODES, envvar="HRMCTL_INVENTORY", show_envvar=False,
    help="Inventory file (default: $HRMCTL_INVENTORY, else ./hrmctl.toml).")]
AcceptNew = Annotated[bool, typer.Option(
    "--accept-new-host-keys", rich_help_panel=NODES,
    help="Record the host key of a node never seen before (a changed key is always refused).")]
Json = Annotated[bool, typer.Option("--json", help="Print JSON for scripts instead of a table.")]
LaunchNodes = Annotated[Optional[str], typer.Option(
    "--nodes", "-n", rich_help_panel=NODES,
    help="Comma-separated node names, the master first. Default: this machine alone.")]
Port = Annotated[Optional[int], typer.Option(
    "--master-port", rich_help_panel=LAUNCH,
    help="Rendezvous port on the master (default: 29500, or the next free one; a run on one node alone: any free port).")]
Nproc = Annotated[Optional[int], typer.Option(
    "--nproc", rich_help_panel=LAUNCH, help="Processes per node (default: the inventory's nproc; auto = one per GPU, else 1).")]
Backend = Annotated[str, typer.Option(
    "--backend", rich_help_panel=LAUNCH, help="auto (NCCL only if every node has CUDA+NCCL), gloo or nccl.")]
Env = Annotated[Optional[list[str]], typer.Option(
    "--env", "-e", metavar="KEY=VALUE", rich_help_panel=LAUNCH, help="Set on every node (repeatable).")]
DryRun = Annotated[bool, typer.Option(
    "--dry-run", rich_help_panel=LAUNCH,
    help="Print each node's exact command and environment (and the model's size); run nothing.")]
RunId = Annotated[Optional[str], typer.Option("--run-id", rich_help_panel=LAUNCH,
                                              help="Name of the run (default: date-time-random).")]
Reprobe = Annotated[bool, typer.Option("--reprobe", rich_help_panel=LAUNCH,
                                       help="Probe torch on every node again (ignore the cached facts).")]


# ---------------------------------------------------------------- the commands


@command("nodes")
def nodes_cmd(nodes: Nodes = None, inventory: Inventory = None, accept_new_host_keys: AcceptNew = False,
              json: Json = False,
              check: Annotated[bool, typer.Option(help="Connect to every node in parallel and run a command there.")]
              = False) -> int:
    """Show every node's resolved settings and where each value came from."""
    from cli.nodes.inventory import load_inventory
    from cli.nodes.view import show_nodes

    inv = load_inventory(inventory)
    return show_nodes(inv, inv.select(nodes), check=check, accept_new_host_keys=accept_new_host_keys,
                      as_json=json, console=out)


@command("doctor")
def doctor_cmd(nodes: Nodes = None, inventory: Inventory = None, accept_new_host_keys: AcceptNew = False,
               json: Json = False,
               master_port: Annotated[int, typer.Option(help="The rendezvous port to check on the master.")]
               = 29500,
               timeout: Annotated[float, typer.Option(help="Seconds each node may take to answer the probe (a cold "
                                                         "laptop's first import of torch can take a minute).")]
               = 120.0,
               verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Full details in every cell, and interfaces.")]
               = False) -> int:
    """Preflight every node: reachability, ports, clocks, CUDA/NCCL, libuv, versions; a fix for every problem.

    Exit 0 when nothing failed, 1 when a check failed, 3 when no node answered."""
    from cli.doctor.command import doctor

    return doctor(inventory, nodes, master_port=master_port, timeout=timeout, verbose=verbose,
                  accept_new_host_keys=accept_new_host_keys, as_json=json, console=out)


@command("init")
def init_cmd(hosts: Annotated[Optional[str], typer.Option(
                 "--hosts", help="Comma-separated hosts: address, name or user@address:port (default: the Host "
                                 "entries of ~/.ssh/config).")] = None,
             inventory: Annotated[Optional[str], typer.Option(
                 "--inventory", "-i", help="The file to write (default: ./hrmctl.toml).")] = None,
             force: Annotated[bool, typer.Option("--force", help="Replace an existing inventory.")] = False,
             check: Annotated[bool, typer.Option(help="Try SSH to every node after writing.")] = True,
             copy_id: Annotated[bool, typer.Option(
                 "--copy-id", help="Where key login fails, install your public key with ssh-copy-id (it asks for "
                                   "the password; hrmctl never sees it).")] = False,
             accept_new_host_keys: AcceptNew = False) -> int:
    """Write hrmctl.toml from the hosts given or ~/.ssh/config, then try SSH to each (and say the fix)."""
    from cli.setup.inventory import init

    return init(hosts, path=inventory, force=force, check=check, accept_new_host_keys=accept_new_host_keys,
                console=out, err=err, copy_id=copy_id)


@command("setup")
def setup_cmd(nodes: Nodes = None, inventory: Inventory = None, accept_new_host_keys: AcceptNew = False,
              json: Json = False,
              dry_run: Annotated[bool, typer.Option(
                  "--dry-run", help="Print per node what would be sent and installed (torch build and why).")] = False,
              allow_dirty: Annotated[bool, typer.Option(
                  "--allow-dirty", help="Send the working tree as it is (default: refuse uncommitted changes).")]
              = False,
              reinstall: Annotated[bool, typer.Option(
                  "--reinstall", help="Build every node's venv again even when its stamp matches.")] = False,
              pip: Annotated[bool, typer.Option(
                  "--pip", help="Install with the nodes' pip instead of uv (slower; same result).")] = False) -> int:
    """Make every node ready to train: this checkout's commit, this machine's packages, the right torch build.

    In parallel, a progress bar per node; a second run on ready nodes changes nothing. Exit 0 when every node
    matches this machine, 1 when one does not, 3 when no node answered."""
    from cli.setup.run import setup_nodes
    from cli.setup.view import show
    from cli.nodes.inventory import load_inventory

    selected = load_inventory(inventory).select(nodes)
    results = setup_nodes(selected, dry_run=dry_run, allow_dirty=allow_dirty, reinstall=reinstall, use_uv=not pip,
                          console=err, progress=not json and err.is_terminal,
                          accept_new_host_keys=accept_new_host_keys)
    return show(results, dry_run=dry_run, as_json=json, console=out, err=err)


@command("top")
def top_cmd(nodes: Nodes = None, inventory: Inventory = None, accept_new_host_keys: AcceptNew = False,
            interval: Annotated[float, typer.Option(help="Seconds between two readings of every node.")] = 1.0,
            once: Annotated[bool, typer.Option("--once", help="Print one snapshot and exit.")] = False,
            json: Annotated[bool, typer.Option(
                "--json", help="JSON for scripts: with --once one document, else one document a line.")] = False) -> int:
    """Every node live: CPU, memory, GPU, network, and the running job's ranks (step rate, loss, the slowest marked).

    `q` or Ctrl-C leaves. Exit 0; with --once, 1 when a node did not answer, 3 when none did."""
    from cli.top.command import top

    return top(inventory, nodes, interval=interval, once=once, as_json=json,
               accept_new_host_keys=accept_new_host_keys, console=out)


@command("sync-data")
def sync_data_cmd(
        node: Annotated[Optional[str], typer.Argument(help="The node to sync (or several with --nodes).",
                                                      show_default=False)] = None,
        nodes: Annotated[Optional[str], typer.Option("--nodes", "-n", rich_help_panel=NODES,
                                                     help="Comma-separated node names to sync, in parallel.")] = None,
        inventory: Inventory = None, accept_new_host_keys: AcceptNew = False, json: Json = False,
        src: Annotated[str, typer.Option(help="Local data directory to send.")] = "data",
        dest: Annotated[Optional[str], typer.Option(
            help="Directory on the node (default: the node's data_dir from the inventory).")] = None,
        checksum: Annotated[bool, typer.Option("--checksum", "-c",
                                               help="Compare SHA-256 of every file, not size+mtime.")] = False,
        delete: Annotated[bool, typer.Option(help="Remove files on the node that are not in the source.")] = False,
        dry_run: Annotated[bool, typer.Option(help="List what would change; change nothing.")] = False,
        stall_timeout: Annotated[float, typer.Option(
            min=1, help="Give up on a node that answers nothing for this many seconds.")] = 30.0) -> int:
    """Make a node's dataset match the local one over SSH: only changes, verified, resumable."""
    from cli.nodes.inventory import load_inventory
    from cli.sync.run import sync_nodes
    from cli.sync.view import show_report

    if node and nodes:
        raise HrmctlError(f"name the nodes once: either `sync-data {node}` or `--nodes {nodes}`, not both")
    if not node and not nodes:
        raise HrmctlError("name the node to sync: `hrmctl sync-data NODE` or `--nodes node1,node2`")
    selected = load_inventory(inventory).select(node or nodes)
    report = sync_nodes(selected, src, dest=dest, checksum=checksum, delete=delete, dry_run=dry_run,
                        console=err, progress=not json, accept_new_host_keys=accept_new_host_keys,
                        stall_timeout=stall_timeout)
    global _quick_exit
    _quick_exit = True  # every connection is closed, nothing left to clean up: see run()
    return show_report(report, as_json=json, console=out, err=err)


@command("test-ddp", context_settings={"ignore_unknown_options": True})
def test_ddp_cmd(
        ctx: typer.Context,
        overrides: Annotated[Optional[list[str]], typer.Argument(
            metavar="KEY=VALUE", show_default=False,
            help="The trainer's overrides for the model whose compute is timed, e.g. model=small task=lm "
                 "training.batch_size=16 (default: the trainer's default model).")] = None,
        nodes: LaunchNodes = None,
        inventory: Inventory = None, accept_new_host_keys: AcceptNew = False, json: Json = False,
        master_port: Port = None, nproc: Nproc = None, backend: Backend = "auto", env: Env = None,
        dry_run: DryRun = False, run_id: RunId = None, reprobe: Reprobe = False,
        min_size: Annotated[str, typer.Option(help="Smallest all_reduce message.")] = "1KiB",
        max_size: Annotated[str, typer.Option(help="Largest all_reduce message.")] = "64MiB",
        seconds: Annotated[float, typer.Option(min=0, help="Measuring time per message size.")] = 0.25,
        soak: Annotated[float, typer.Option(min=0, help="Then keep checking all_reduce for this many seconds.")] = 0.0,
        no_bandwidth: Annotated[bool, typer.Option(help="Correctness only (no bandwidth, no training budget).")]
        = False) -> int:
    """A real collective across the nodes: correct results (all_reduce, broadcast, all_gather, barrier) and bandwidth.

    all_reduce bandwidth (algbw, busbw) from --min-size to --max-size, and small-message latency.
    Then what that means for training: the model's compute per step against DDP's predicted communication,
    and the suggestion (ddp, the bf16 hook, or diloco with an H), saved for `hrmctl train`.
    Exit 1 on a wrong result."""
    from cli.launch.command import DDP_CHECK, ddp_check_args, test_ddp
    from cli.launch.plan.options import launch_options

    args = ddp_check_args(min_size=min_size, max_size=max_size, seconds=seconds, soak=soak, no_bandwidth=no_bandwidth,
                          overrides=overrides)
    opts = launch_options(inventory=inventory, nodes=nodes, env=env, reprobe=reprobe, master_port=master_port,
                          nproc=nproc, backend=backend, dry_run=dry_run, run_id=run_id,
                          accept_new_host_keys=accept_new_host_keys, module=DDP_CHECK, args=args)
    return test_ddp(opts, overrides=list(overrides or []), as_json=json, console=out, err=err,
                    own_options=_options_of(ctx))


@command("train", context_settings={"ignore_unknown_options": True})
def train_cmd(
        ctx: typer.Context,
        overrides: Annotated[Optional[list[str]], typer.Argument(
            metavar="KEY=VALUE", show_default=False,
            help="Trainer overrides, e.g. model=hrm-tiny training.max_steps=500 (see docs/trainer.md).")] = None,
        nodes: LaunchNodes = None,
        inventory: Inventory = None, accept_new_host_keys: AcceptNew = False, json: Json = False,
        master_port: Port = None, nproc: Nproc = None, backend: Backend = "auto", env: Env = None,
        dry_run: DryRun = False, run_id: RunId = None, reprobe: Reprobe = False,
        max_restarts: Annotated[int, typer.Option(
            min=0, rich_help_panel=LAUNCH,
            help="Restart the whole job from its last checkpoint after a failure, up to N times.")] = 0,
        sync_data: Annotated[bool, typer.Option(
            rich_help_panel=LAUNCH, help="Sync the local dataset to every other node first.")] = False,
        module: Annotated[str, typer.Option(
            rich_help_panel=LAUNCH, help="The Python module torchrun starts on every rank.")] = "auralm.training.train",
        slurm: Annotated[bool, typer.Option(
            "--slurm", rich_help_panel=SLURM,
            help="Submit the run as a Slurm batch job (sbatch) and print its job id; --nodes is then a count.")] = False,
        gpus_per_node: SlurmInt("--gpus-per-node", "GPUs per node (--slurm).") = None,
        cpus_per_task: SlurmInt("--cpus-per-task", "CPUs for each node's torchrun (--slurm).") = None,
        time_limit: SlurmText("--time", "Time limit, as Slurm spells it: 02:00:00 (--slurm).") = None,
        partition: SlurmText("--partition", "Partition (--slurm).") = None,
        account: SlurmText("--account", "Account charged (--slurm).") = None,
        qos: SlurmText("--qos", "Quality of service (--slurm).") = None,
        constraint: SlurmText("--constraint", "Node features, e.g. gpu (--slurm).") = None,
        detach: Annotated[bool, typer.Option(
            "--detach", rich_help_panel=LAUNCH,
            help="Run on without this terminal: return once the first step is logged (then `hrmctl attach RUN`, "
                 "`hrmctl stop RUN`).")] = False,
        supervisor: Annotated[bool, typer.Option("--supervisor", hidden=True)] = False) -> int:
    """torchrun on every node, one merged log, one Ctrl-C; with no --nodes, this machine alone.

    Trainer overrides follow the options: `hrmctl train --nodes node0,node1 model=hrm-tiny training.max_steps=200`.
    With no overrides it trains the embedded default (TRM on generated sudoku puzzles)."""
    from cli.launch.command import train
    from cli.launch.plan.options import launch_options

    if detach:
        if dry_run:
            raise HrmctlError("--detach with --dry-run: a dry run starts nothing to detach; drop one of them")
        if slurm:
            raise HrmctlError("--detach with --slurm: a submitted run never holds this terminal; drop --detach")
        from pathlib import Path

        from cli.launch.supervise.detach import detach as start_detached

        return start_detached(_argv, run_id, Path("runs"), out, err, as_json=json)
    request = None
    if slurm:  # the nodes are Slurm's to give: --nodes counts them
        from cli.slurm.submit import SlurmOptions, inventory_table, node_count

        request = SlurmOptions(nodes=node_count(nodes), gpus_per_node=gpus_per_node, cpus_per_task=cpus_per_task,
                               time=time_limit, partition=partition, account=account, qos=qos,
                               constraint=constraint).with_defaults(inventory_table(inventory))
        nodes = "localhost"  # the options' checks only: the job's own hrmctl takes the allocation's nodes
    opts = launch_options(inventory=inventory, nodes=nodes, env=env, reprobe=reprobe, master_port=master_port,
                          nproc=nproc, backend=backend, dry_run=dry_run, run_id=run_id,
                          accept_new_host_keys=accept_new_host_keys, module=module, args=list(overrides or []),
                          max_restarts=max_restarts, detached=supervisor)
    return train(opts, sync_data=sync_data, as_json=json, console=out, err=err, own_options=_options_of(ctx),
                 slurm=request)


def _options_of(ctx: typer.Context) -> list[str]:
    """The command's long options, for the "did you mean" of an unknown one."""
    return [o for p in ctx.command.params for o in getattr(p, "opts", []) if o.startswith("--")]


RunsDir = Annotated[str, typer.Option("--dir", help="The runs directory (where `hrmctl train` writes: ./runs).")]
RunRef = Annotated[str, typer.Argument(metavar="RUN", show_default=False,
                                       help="A run id, a unique prefix of one, or a run directory.")]


@command("runs")
def runs_cmd(json: Json = False, runs_dir: RunsDir = "runs") -> int:
    """The runs under runs/: id, start, duration, nodes, task, model, status, steps, best result.

    Status: running, finished, failed or stopped, as `hrmctl train` recorded it (status.json); for a run without that
    record, inferred from its files, or unknown (see docs/runs.md). No runs is a line and exit code 0."""
    from cli.runs.view import show_runs

    return show_runs(runs_dir, as_json=json, console=out)


@command("logs")
def logs_cmd(run: RunRef,
             node: Annotated[Optional[str], typer.Option("--node", help="Only this node's log.")] = None,
             follow: Annotated[bool, typer.Option(
                 "--follow", "-f", help="Keep printing as the logs grow, until the run ends (or Ctrl-C).")] = False,
             runs_dir: RunsDir = "runs") -> int:
    """A run's log: every node's lines merged in time order (or one node's); --follow like tail -f.

    An unknown RUN is one line naming the nearest ids (exit code 2)."""
    from cli.runs.catalog import resolve
    from cli.runs.logs import show_logs

    return show_logs(resolve(run, runs_dir), node=node, follow=follow)


@command("attach")
def attach_cmd(run: RunRef, runs_dir: RunsDir = "runs",
               lines: Annotated[int, typer.Option("--lines", min=0, help="Merged log lines shown before the new ones.")]
               = 20) -> int:
    """Follow a running run (`hrmctl train --detach`, or one in another terminal) until it ends.

    The last lines of every node's log merged, then each new one; at the end the run's last line, and its exit
    code. Ctrl-C detaches (exit code 0): the run goes on."""
    from cli.runs.catalog import resolve
    from cli.runs.control import attach

    return attach(resolve(run, runs_dir), last=lines)


@command("stop")
def stop_cmd(run: RunRef, runs_dir: RunsDir = "runs") -> int:
    """Stop a running run on every node and wait until nothing of it is left.

    Its launcher (detached or not, on this machine) gets SIGTERM and stops the job on every node, as Ctrl-C would;
    exit code 0 once every node is confirmed stopped (also when the run was not running), 1 otherwise."""
    from cli.runs.catalog import resolve
    from cli.runs.control import stop

    return stop(resolve(run, runs_dir))


@command("plot")
def plot_cmd(runs: Annotated[list[str], typer.Argument(metavar="RUN...", show_default=False,
                                                       help="One or more runs: ids, unique prefixes or directories.")],
             metric: Annotated[str, typer.Option("--metric", "-m",
                                                 help="Any key of metrics.jsonl: loss, val_loss, lr, grad_norm, ...")]
             = "loss",
             out_file: Annotated[Optional[str], typer.Option("--out", "-o", metavar="FILE.png",
                                                             help="Write a PNG (matplotlib) instead of drawing in the "
                                                                  "terminal (plotext).")] = None,
             x: Annotated[str, typer.Option(
                 "--x", help="The x axis: step, time (training seconds), tokens or samples.")] = "step",
             runs_dir: RunsDir = "runs") -> int:
    """The curves of one or several runs, one line per run (legend: run id, and sync mode or model where they differ).

    An unknown metric is one line listing the available ones (exit code 2)."""
    from cli.runs.plot import plot

    return plot(runs, runs_dir=runs_dir, metric=metric, x=x, out_file=out_file, console=out, err=err)


# ---------------------------------------------------------------- the trainer's tools (cli/tools/: their options)


from cli.tools import evaluate, export, generate, prepare_data, solve, validate_model  # noqa: E402 - no torch

command("prepare-data", cls=prepare_data.ReadGuides,
        context_settings={"allow_extra_args": True})(prepare_data.prepare_data)
command("eval")(evaluate.evaluate)
command("solve")(solve.solve)
command("generate")(generate.generate)
command("export")(export.export)
command("validate-model")(validate_model.validate_model)


# ---------------------------------------------------------------- running it


def main(argv: list[str] | None = None) -> int:
    """Entry point: every expected failure is one line on stderr and a meaningful exit code."""
    from typer.exceptions import TyperException  # the base of typer's (click's) usage errors

    global _argv
    argv = sys.argv[1:] if argv is None else list(argv)
    _argv = argv
    cli = typer.main.get_command(app)
    try:
        if not argv:
            cli.main(["--help"], prog_name="hrmctl", standalone_mode=False)
            return 2
        code = cli.main(argv, prog_name="hrmctl", standalone_mode=False)
        return code if isinstance(code, int) else 0
    except TyperException as exc:  # a usage error: unknown option or command, a bad or missing value
        message = " ".join(exc.format_message().split())
        ctx = getattr(exc, "ctx", None)
        where = f" (see `{ctx.command_path} --help`)" if ctx is not None else ""
        err.print(f"error: {message}{where}", markup=False, highlight=False, soft_wrap=True)
        return getattr(exc, "exit_code", 2)
    except HrmctlError as exc:
        err.print(f"error: {exc}", markup=False, highlight=False, soft_wrap=True)
        return exc.exit_code
    except (typer.Abort, KeyboardInterrupt):
        err.print("interrupted")
        return 130


def _file_id(fd: int) -> tuple[int, int] | None:
    try:
        st = os.fstat(fd)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _reader_went(stdout_was: tuple[int, int] | None) -> bool:
    """After a SystemExit(1): was it click's or rich's answer to a reader gone (EPIPE)? click wraps the streams in
    PacifyFlushWrapper, rich points stdout at /dev/null; either way nobody reads the output any more."""
    from click.utils import PacifyFlushWrapper
    from cli.launch.run.log import reader_gone

    return (isinstance(sys.stdout, PacifyFlushWrapper) or isinstance(sys.stderr, PacifyFlushWrapper)
            or _file_id(1) != stdout_was or reader_gone(sys.stdout))


def run() -> None:
    stdout_was = _file_id(1)
    try:
        code = main()
    except SystemExit as exc:  # the reader gone before the run (preflight, --dry-run, --help into `head -1`)
        if exc.code != 1 or not _reader_went(stdout_was):
            raise
        from cli.launch.run.log import to_devnull

        for stream in (sys.__stdout__, sys.__stderr__):  # the last flushes go nowhere, not into a traceback
            to_devnull(stream)
        code = 128 + signal.SIGPIPE  # 141, as a run whose reader goes (cli.launch.run.attempt.OUTPUT_GONE_CODE)
    if _quick_exit:
        from cli.fast_start import quick_exit
        quick_exit(code)  # about 90 ms less than the interpreter's own teardown
    if "torch" in sys.modules:  # a trainer's tool ran (eval, solve ...): what it made is left out of the
        import gc  # collector's passes at exit (auralm.errors.exit_frozen: about 0.4 s of CPU with torch)

        gc.freeze()
    sys.exit(code)


if __name__ == "__main__":
    run()
