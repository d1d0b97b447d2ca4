"""`hrmctl train --slurm`'s own reading (cli/slurm/submit.py), without a cluster: the batch script, the inventory's
[slurm] defaults, --nodes as a count, and Slurm's refusal shortened to its reason. The cluster itself:
tests/cluster/test_slurm.py."""


import pytest

from cli.errors import HrmctlError
from cli.launch.plan.options import LaunchOptions
from cli.nodes.inventory import local_node
from cli.slurm import job
from cli.slurm.submit import SlurmOptions, batch_script, gpu_hint, node_count, refusal, train_args


def test_script_asks_for_the_signal_and_requeue_and_runs_hrmctl_inside(tmp_path):
    request = SlurmOptions(nodes=2, time="01:00:00").with_defaults({"account": "m1234", "time": "02:00:00"})
    script = batch_script("r1", tmp_path / "runs" / "r1", request, ["--backend", "gloo", "--", "model=tiny", "a=b c"])
    lines = script.splitlines()
    assert lines[0] == "#!/bin/bash"
    assert {"#SBATCH --nodes=2", "#SBATCH --time=01:00:00", "#SBATCH --account=m1234", "#SBATCH --requeue",
            "#SBATCH --signal=B:USR1@120", f"#SBATCH --output={tmp_path}/runs/r1/slurm-%j.out"} <= set(lines)
    assert not any("--partition" in ln for ln in lines)  # not given: Slurm's default
    assert lines[-1].startswith("exec ") and "-m cli.slurm.job --run-id r1 --backend gloo -- model=tiny 'a=b c'" \
        in lines[-1]


def test_the_jobs_launch_reads_back_what_the_submission_wrote():
    """The batch script's arguments (train_args) read by the job's own start (cli/slurm/job.py): every option the
    user gave comes back, an override that looks like an option stays an override, and the requeued start's
    resume=latest lands among the overrides."""
    opts = LaunchOptions(nodes=[local_node()], args=["model=tiny", "--weird=1", "a=b c"], backend="gloo", nproc=2,
                         master_port=29600, max_restarts=3, module="auralm.planning.ddp_check",
                         env={"NCCL_DEBUG": "INFO", "X": "a b"})
    back = job.parse(["--run-id", "r1", *train_args(opts), "resume=latest"])
    assert (back.run_id, back.backend, back.nproc, back.master_port, back.max_restarts, back.module) == \
        ("r1", "gloo", 2, 29600, 3, "auralm.planning.ddp_check")
    assert back.env == ["NCCL_DEBUG=INFO", "X=a b"]
    assert back.overrides == ["model=tiny", "--weird=1", "a=b c", "resume=latest"]
    plain = job.parse(["--run-id", "r2", *train_args(LaunchOptions(nodes=[local_node()], args=["model=tiny"]))])
    assert (plain.backend, plain.nproc, plain.master_port, plain.max_restarts, plain.env, plain.overrides) == \
        ("auto", None, None, 0, [], ["model=tiny"])


def test_bad_options_are_one_line():
    with pytest.raises(HrmctlError, match="unknown key 'acount'"):
        SlurmOptions().with_defaults({"acount": "x"})
    with pytest.raises(HrmctlError, match="with --slurm, --nodes is how many nodes"):
        node_count("node0,node1")
    assert node_count("3") == 3 and node_count(None) is None
    with pytest.raises(HrmctlError, match="a Slurm value is one word"):  # a newline would add a line to the script
        SlurmOptions(partition="gpu\nrm -rf ~").directives()
    assert SlurmOptions(partition="gpu").directives() == ["#SBATCH --partition=gpu"]


def test_refusal_is_slurms_reason():
    text = "sbatch: error: invalid partition specified: nosuch\nsbatch: error: Batch job submission failed: " \
           "Invalid partition name specified\n"
    assert refusal(text) == "Invalid partition name specified"
    gres = refusal("sbatch: error: Batch job submission failed: Invalid generic resource (gres) specification\n")
    assert "--gpus-per-node 8: more GPUs per node" in gpu_hint(gres, SlurmOptions(gpus_per_node=8))
    assert gpu_hint("Requested node configuration is not available", SlurmOptions(gpus_per_node=8))
    assert gpu_hint(gres, SlurmOptions()) == ""  # the GPUs were not asked for here: no guess
    assert gpu_hint("Invalid partition name specified", SlurmOptions(gpus_per_node=8)) == ""
