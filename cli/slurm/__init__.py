"""Slurm: hrmctl on a cluster whose nodes are reached through Slurm, not SSH (docs/slurm.md).

  allocation.py  inside an allocation (salloc, or an sbatch script: SLURM_JOB_ID set), its nodes as the launch's
                 nodes, each reached with srun (cli/nodes/srun.py); the Slurm commands found, or one clear line
  submit.py      `hrmctl train --slurm`: the batch script (which runs job.py inside the allocation) written
                 into the run directory and given to sbatch; runs/<run-id>/slurm.json records the job
  job.py         the batch script's start: the arguments submit.py wrote, read without typer, given to the launch
                 of `hrmctl train` (cli/launch/command.py)
  jobs.py        a job's state (squeue, else scontrol show job, else sacct) and its cancelling (scancel), for
                 `hrmctl runs` and `hrmctl stop`

The launch itself (cli/launch/) is the same one as on SSH nodes: only the nodes and the way commands reach them
differ. May import: cli.nodes, cli.errors, and cli.launch (submit.py and job.py: the launch's options and
its start).
"""
