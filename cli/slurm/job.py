"""The batch script's start of the run inside the allocation (cli/slurm/submit.py writes the line):

    python -m cli.slurm.job --run-id ID [--backend B] [--nproc N] [--master-port P] [--max-restarts R]
                            [--module M] [--env KEY=VALUE ...] -- OVERRIDES...

It reads exactly the options `train_args` writes and hands them to the launch of `hrmctl train` (cli/launch/command.py
`train`, its nodes the allocation's), so a submitted run starts training as one typed inside `salloc` does. It is not
the typer command line: typer builds every command's options, with a pydantic adapter each, before anything runs,
about 0.5 s of each job's start on a 2-core node (bench/slurm.py), for arguments hrmctl wrote itself.
May import: cli.launch (command, options), cli.errors, rich.
"""

from __future__ import annotations

import argparse
import sys

from cli.errors import HrmctlError
from cli.launch.plan.options import TRAINER


def parse(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m cli.slurm.job", allow_abbrev=False,
                                 description="hrmctl train inside a Slurm allocation, as its batch script starts it")
    ap.add_argument("--run-id", required=True)
    ap.add_argument("--backend", default="auto")
    ap.add_argument("--nproc", type=int)
    ap.add_argument("--master-port", type=int)
    ap.add_argument("--max-restarts", type=int, default=0)
    ap.add_argument("--module", default=TRAINER)
    ap.add_argument("--env", action="append", default=[])
    ap.add_argument("overrides", nargs="*")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    from rich.console import Console

    err = Console(stderr=True)
    try:
        hold_first(args.run_id)
        from cli.launch.command import train
        from cli.launch.plan.options import launch_options

        opts = launch_options(inventory=None, nodes=None, env=args.env, reprobe=False, master_port=args.master_port,
                              nproc=args.nproc, backend=args.backend, run_id=args.run_id, module=args.module,
                              args=list(args.overrides), max_restarts=args.max_restarts)
        return train(opts, sync_data=False, as_json=False, console=Console(), err=err)
    except HrmctlError as exc:
        err.print(f"error: {exc}", markup=False, highlight=False, soft_wrap=True)
        return exc.exit_code
    except KeyboardInterrupt:
        err.print("interrupted")
        return 130


def hold_first(run_id: str) -> None:
    """torchrun held on every node of the allocation before anything else runs here (cli/launch/preflight/prestart.py):
    its `import torch` starts as early as a hand-written script's srun would start it."""
    from cli.launch.preflight.prestart import hold_ahead
    from cli.slurm.allocation import allocation_id, allocation_nodes

    job = allocation_id()
    if job:
        hold_ahead(allocation_nodes(job), run_id)


if __name__ == "__main__":
    sys.exit(main())
