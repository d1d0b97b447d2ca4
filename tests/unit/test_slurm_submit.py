"""`hrmctl train --slurm`'s own reading (cli/slurm/submit.py), without a cluster: the batch script, the inventory's
[slurm] defaults, --nodes as a count, and Slurm's refusal shortened to its reason. The cluster itself:
tests/cluster/test_slurm.py."""

from pathlib import Path

import pytest

from cli.errors import HrmctlError
from cli.slurm.submit import SlurmOptions, batch_script, node_count, refusal


def test_script_asks_for_the_signal_and_requeue_and_runs_hrmctl_inside(tmp_path):
    request = SlurmOptions(nodes=2, time="01:00:00").with_defaults({"account": "m1234", "time": "02:00:00"})
    script = batch_script("r1", tmp_path / "runs" / "r1", request, ["--backend", "gloo", "model=tiny", "a=b c"])
    lines = script.splitlines()
    assert lines[0] == "#!/bin/bash"
    assert {"#SBATCH --nodes=2", "#SBATCH --time=01:00:00", "#SBATCH --account=m1234", "#SBATCH --requeue",
            "#SBATCH --signal=B:USR1@120", f"#SBATCH --output={tmp_path}/runs/r1/slurm-%j.out"} <= set(lines)
    assert not any("--partition" in ln for ln in lines)  # not given: Slurm's default
    assert lines[-1].startswith("exec ") and "-m cli train --run-id r1 --backend gloo model=tiny 'a=b c'" in lines[-1]


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
