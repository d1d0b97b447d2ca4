"""`hrmctl train --slurm`: the run as a Slurm batch job. The script is written into the run directory
(runs/<run-id>/slurm.sbatch, so the run can be submitted again by hand) and given to sbatch; the job id is printed
and recorded in runs/<run-id>/slurm.json (what `hrmctl runs`, `logs` and `stop` read). The script runs
hrmctl's launch itself inside the allocation (`python -m cli.slurm.job`: `hrmctl train`'s launch without the typer
command line, whose start costs about 0.5 s), with the same run id and overrides: the launch there is the one of
cli/launch/, its nodes the allocation's (cli/slurm/allocation.py), so a submitted run and one typed inside `salloc`
start training the same way.

Time limits: the script asks Slurm for SIGUSR1 to the batch shell (hrmctl, which `exec` made it) SIGNAL_S before
the limit (`--signal=B:USR1@...`) and may be requeued (`--requeue`). On that signal hrmctl has every rank save a
checkpoint at a step they agree on (cli/launch/run/save_stop.py), stops the job and requeues it (`scontrol requeue`);
on `scontrol requeue`, scancel or preemption Slurm sends SIGTERM to every process of the job, and the ranks save
the same way. A requeued start (SLURM_RESTART_COUNT > 0) resumes from the run's last checkpoint (resume=latest).

Options come from the command line, else the inventory's `[slurm]` table (same names, with underscores), else
Slurm's own defaults (nothing written).
"""

from __future__ import annotations

import json
import os
import shlex
import sys
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from cli.errors import HrmctlError
from cli.launch.plan.options import TRAINER
from cli.slurm.allocation import slurm

SCRIPT_NAME = "slurm.sbatch"
JOB_FILE = "slurm.json"  # {"job_id", "script", "submitted", "options"}: read by cli/runs/catalog.py
SIGNAL_S = 120  # SIGUSR1 this long before the time limit: time for a checkpoint and the stop
REFUSED_EXIT = 2  # a partition, account or QOS that Slurm refuses is bad input


@dataclass
class SlurmOptions:
    """What `--slurm` asks of Slurm (None: not given; Slurm's default)."""

    nodes: int | None = None
    gpus_per_node: int | None = None
    cpus_per_task: int | None = None
    time: str | None = None
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    constraint: str | None = None

    def with_defaults(self, table: dict) -> "SlurmOptions":
        """The inventory's [slurm] values where the command line gave none; an unknown key is one clear line."""
        names = [f.name for f in fields(self)]
        for key in table:
            if key not in names:
                raise HrmctlError(f"inventory [slurm]: unknown key {key!r}; known: {', '.join(names)}")
        given = {k: v for k, v in asdict(self).items() if v is not None}
        return SlurmOptions(**{**{k: table.get(k) for k in names}, **given})

    def directives(self) -> list[str]:
        flags = {"nodes": self.nodes, "gpus-per-node": self.gpus_per_node, "cpus-per-task": self.cpus_per_task,
                 "time": self.time, "partition": self.partition, "account": self.account, "qos": self.qos,
                 "constraint": self.constraint}
        for k, v in flags.items():  # a value is one word of the script's #SBATCH line: nothing may end that line
            if v is not None and (not str(v) or any(c.isspace() or not c.isprintable() for c in str(v))):
                raise HrmctlError(f"--{k} {str(v)!r}: a Slurm value is one word without spaces, such as --{k} "
                                  f"{'gpu' if k in ('partition', 'constraint') else '2'}")
        return [f"#SBATCH --{k}={v}" for k, v in flags.items() if v is not None]


def node_count(nodes: str | None) -> int | None:
    """--nodes with --slurm: how many nodes to ask Slurm for."""
    if nodes is None:
        return None
    if not nodes.strip().isdigit() or int(nodes) < 1:
        raise HrmctlError(f"--nodes {nodes}: with --slurm, --nodes is how many nodes to ask Slurm for (such as "
                          "--nodes 2); Slurm chooses which")
    return int(nodes)


def train_args(opts) -> list[str]:
    """The job's own launch arguments (what cli/slurm/job.py reads): what the user asked for (a LaunchOptions), then
    `--` and the overrides."""
    args = [] if opts.backend == "auto" else ["--backend", opts.backend]
    for flag, value in (("--nproc", opts.nproc), ("--master-port", opts.master_port),
                        ("--max-restarts", opts.max_restarts or None)):
        if value is not None:
            args += [flag, str(value)]
    if opts.module != TRAINER:
        args += ["--module", opts.module]
    for key, value in opts.env.items():
        args += ["--env", f"{key}={value}"]
    return [*args, "--", *opts.args]


def inventory_table(inventory: str | None) -> dict:
    """The inventory's [slurm] table ({} without one), read apart from its nodes (a cluster needs none)."""
    from cli.nodes.inventory import _read_toml, find_inventory

    path = find_inventory(inventory)
    table = _read_toml(path).get("slurm", {}) if path else {}
    if not isinstance(table, dict):
        raise HrmctlError(f"{path}: [slurm] must be a table")
    return table


def batch_script(run_id: str, run_dir: Path, request: SlurmOptions, train_args: list[str]) -> str:
    """The batch script: Slurm's directives, then hrmctl's launch (this Python, this checkout: cli/slurm/job.py)
    inside the allocation."""
    hrmctl = [sys.executable, "-m", "cli.slurm.job", "--run-id", run_id, *train_args]
    lines = ["#!/bin/bash",
             f"# hrmctl train --slurm, run {run_id}: hrmctl train's launch inside the allocation, on its nodes (srun)",
             f"#SBATCH --job-name=hrmctl-{run_id}", "#SBATCH --ntasks-per-node=1", *request.directives(),
             f"#SBATCH --chdir={os.getcwd()}", f"#SBATCH --output={run_dir.resolve()}/slurm-%j.out",
             "#SBATCH --open-mode=append", f"#SBATCH --signal=B:USR1@{SIGNAL_S}", "#SBATCH --requeue", "",
             "# a requeued start (time limit, preemption, scontrol requeue) resumes from the last checkpoint",
             'resume=(); [ "${SLURM_RESTART_COUNT:-0}" -gt 0 ] && resume=(resume=latest)',
             f"exec {shlex.join(hrmctl)} \"${{resume[@]}}\"", ""]
    return "\n".join(lines)


def submit(run_id: str, runs_dir: Path, request: SlurmOptions, train_args: list[str], *, dry_run: bool) -> dict:
    """Write the script, give it to sbatch; {"run_id", "job_id", "script", ...}. --dry-run: the script only."""
    run_dir = runs_dir / run_id
    script = batch_script(run_id, run_dir, request, train_args)
    if dry_run:
        return {"run_id": run_id, "job_id": None, "script": script}
    from cli.slurm.allocation import need

    need("sbatch")
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / SCRIPT_NAME
    path.write_text(script)
    res = slurm(["sbatch", "--parsable", str(path)], timeout=60)
    if res.returncode != 0:
        reason = refusal(res.stderr or res.stdout)
        raise HrmctlError(f"sbatch refused the job: {reason}{gpu_hint(reason, request)}", exit_code=REFUSED_EXIT)
    job_id = res.stdout.strip().split(";")[0]
    doc = {"run_id": run_id, "job_id": job_id, "script": str(path), "submitted": round(time.time(), 3),
           "options": {k: v for k, v in asdict(request).items() if v is not None}}
    (run_dir / JOB_FILE).write_text(json.dumps(doc, indent=2) + "\n")
    return doc


def gpu_hint(reason: str, request: SlurmOptions) -> str:
    """What to do when Slurm refused the GPUs asked for: its words (no such GPU resource, or no node with that many)
    do not say that --gpus-per-node was the cause."""
    words = reason.lower()
    if request.gpus_per_node is None or not any(w in words for w in ("gres", "generic resource",
                                                                      "node configuration is not available")):
        return ""
    return (f" (--gpus-per-node {request.gpus_per_node}: more GPUs per node than the partition's nodes have? "
            "`sinfo -o '%P %G'` lists each partition's GPUs; ask for fewer, or another --partition)")


def refusal(text: str) -> str:
    """Slurm's own reason in one line: `sbatch: error: Batch job submission failed: Invalid account ...` ->
    `Invalid account ...`."""
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    last = lines[-1] if lines else "no reason given"
    for prefix in ("sbatch: error:", "Batch job submission failed:"):
        last = last.removeprefix(prefix).strip()
    return last[:200]
