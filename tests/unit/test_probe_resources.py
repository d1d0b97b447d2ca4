"""The probe's resource facts: from psutil when the node's Python has it, else from the minimal
standard-library fallback, with the same keys (the probe runs on nodes before anything is installed)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import psutil
import pytest

from node import probe
from netcheck.node_checks import resources_check
from netcheck.node_probe_client import parse_probe
from node.ship import program

GB = 2**30


def run_probe(data_dir, hide_psutil: bool, python: str = sys.executable) -> dict:
    """The probe as a node runs it: what program("probe") sends, read by a fresh interpreter from its standard input
    (psutil hidden on demand; this venv's, which has it). The project's packages are hidden too (a meta path finder
    that refuses them): the modules the probe needs come with it."""
    code = ("import sys\n" + ("sys.modules['psutil'] = None\n" if hide_psutil else "")
            + "class Hide:\n    def find_spec(self, name, *a):\n"
            + "        if name.split('.')[0] in ('node', 'netcheck', 'cli', 'auralm'): raise ImportError(name)\n"
            + "sys.meta_path.insert(0, Hide())\n"
            + f"exec(compile({program('probe')!r}, '<probe>', 'exec'))\n")
    res = subprocess.run([python, "-", "--no-torch", "--data-dir", str(data_dir)], input=code, capture_output=True,
                         text=True, timeout=60, cwd=data_dir)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout.strip().splitlines()[-1])


def test_resource_facts_are_psutils(tmp_path):
    facts = probe.resource_facts()
    assert facts["source"] == "psutil"
    assert facts["cpu_count"] == psutil.cpu_count(logical=True)
    assert facts["cpu_physical"] == psutil.cpu_count(logical=False)
    assert facts["mem_total_gb"] == round(psutil.virtual_memory().total / GB, 2)
    assert facts["mem_available_gb"] == pytest.approx(psutil.virtual_memory().available / GB, abs=0.5)
    assert facts["load_avg"] == pytest.approx(list(psutil.getloadavg()), abs=1.0)
    assert probe.disk_facts(str(tmp_path))["free_gb"] == pytest.approx(psutil.disk_usage(str(tmp_path)).free / GB,
                                                                       abs=0.5)


def test_stdlib_fallback_gives_the_same_keys_and_values(tmp_path):
    with_ps = run_probe(tmp_path, hide_psutil=False)
    without = run_probe(tmp_path, hide_psutil=True)
    a, b = with_ps["resources"], without["resources"]
    assert (a["source"], b["source"]) == ("psutil", "stdlib")
    assert set(a) == set(b) and set(with_ps) == set(without) and set(with_ps["data"]) == set(without["data"])
    assert None not in b.values(), b  # on Linux the fallback knows every fact
    for key in ("cpu_count", "cpu_physical", "mem_total_gb"):
        assert a[key] == b[key], key
    assert b["mem_available_gb"] == pytest.approx(a["mem_available_gb"], abs=0.5)
    assert b["load_avg"] == pytest.approx(a["load_avg"], abs=1.0)
    assert without["data"]["free_gb"] == pytest.approx(with_ps["data"]["free_gb"], abs=0.5)
    # what the launcher reads (NodeProbe.cpu_count, .ram_gb) comes from the fallback's keys alike
    p = parse_probe("node0", json.dumps(without))
    assert (p.cpu_count, p.ram_gb) == (b["cpu_count"], b["mem_total_gb"])


def test_the_doctor_row_shows_load_and_available_memory(tmp_path):
    p = parse_probe("node0", json.dumps(run_probe(tmp_path, hide_psutil=False)))
    assert p.mem_available_gb is not None and len(p.load_avg) == 3
    detail = resources_check(p).detail
    assert f"{p.cpu_count} CPU, load {p.load_avg[0]:g}, {p.ram_gb} GB RAM ({p.mem_available_gb:g} available)" in detail
    assert "GB free for data" in detail


def test_usable_cpus_follow_the_affinity_and_the_tightest_cpu_quota(tmp_path):
    """cpu_usable: the process's affinity (a real one: taskset), capped by its CPU cgroup's quota or an ancestor's
    (cgroup v1 and v2 files laid out as the kernel does), rounded up; the launch gives each rank that many
    threads over its ranks (cli/launch/plan/plan.py), not the machine's count."""
    machine = len(os.sched_getaffinity(0))
    assert probe.cpu_usable(str(tmp_path), str(tmp_path / "none")) == machine  # no cgroup readable: the affinity
    pinned = subprocess.run(["taskset", "-c", "0", sys.executable, "-c",
                             "from node.probe import cpu_usable; print(cpu_usable('/nonexistent'))"],
                            capture_output=True, text=True, check=True)
    assert pinned.stdout.strip() == "1"
    v1 = tmp_path / "v1"
    (v1 / "cpu" / "job" / "step").mkdir(parents=True)
    (v1 / "cpu" / "job" / "cpu.cfs_quota_us").write_text("150000\n")  # 1.5 CPUs on the parent: 2
    (v1 / "cpu" / "job" / "cpu.cfs_period_us").write_text("100000\n")
    (v1 / "cpu" / "job" / "step" / "cpu.cfs_quota_us").write_text("-1\n")  # none on the step itself
    (v1 / "cpu" / "job" / "step" / "cpu.cfs_period_us").write_text("100000\n")
    proc = tmp_path / "cgroup1"
    proc.write_text("5:cpu,cpuacct:/job/step\n4:memory:/job\n")
    assert probe.cpu_usable(str(v1), str(proc)) == min(machine, 2)
    (v1 / "cpu" / "job" / "cpu.cfs_quota_us").write_text("50000\n")  # half a CPU: one thread
    assert probe.cpu_usable(str(v1), str(proc)) == 1
    v2 = tmp_path / "v2"
    (v2 / "node").mkdir(parents=True)
    (v2 / "node" / "cpu.max").write_text("max 100000\n")
    proc.write_text("0::/node\n")
    assert probe.cpu_usable(str(v2), str(proc)) == machine
    (v2 / "cpu.max").write_text("30000 10000\n")  # three CPUs at the root of the chain
    assert probe.cpu_usable(str(v2), str(proc)) == min(machine, 3)
    # a Slurm job's --cpus-per-task, kept to even where Slurm binds nothing (TaskPlugin=task/none, as on the lab)
    assert probe.cpu_usable(str(v2), str(proc), {"SLURM_CPUS_PER_TASK": "1"}) == 1
    assert probe.cpu_usable(str(v2), str(proc), {"SLURM_CPUS_PER_TASK": "64"}) == min(machine, 3)


def test_oom_kills_are_counted_in_the_own_memory_cgroup_v1_or_v2_else_the_machines(tmp_path):
    """node.probe.oom_kills from faked /proc/self/cgroup and cgroup files (the real OOM killer's count in a
    real cgroup: tests/cluster/test_memory_cap.py)."""
    oom_kills = probe.oom_kills
    vmstat, proc = tmp_path / "vmstat", tmp_path / "cgroup"
    vmstat.write_text("pgfault 9\noom_kill 7\n")
    v1 = tmp_path / "v1" / "memory" / "session"
    v1.mkdir(parents=True)
    (v1 / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 2\n")
    proc.write_text("5:cpu,cpuacct:/\n4:memory:/session\n0::/\n")
    args = dict(proc_cgroup=str(proc), vmstat=str(vmstat))
    assert oom_kills(str(tmp_path / "v1"), **args) == [str(v1 / "memory.oom_control"), 2]
    assert oom_kills(str(tmp_path / "v1"), **args, machine=True) == [str(vmstat), 7]
    v2 = tmp_path / "v2" / "user.slice" / "session-3.scope"
    v2.mkdir(parents=True)
    (v2 / "memory.events").write_text("low 0\nhigh 0\nmax 1\noom 1\noom_kill 1\n")
    proc.write_text("0::/user.slice/session-3.scope\n")
    assert oom_kills(str(tmp_path / "v2"), **args) == [str(v2 / "memory.events"), 1]
    proc.write_text("0::/\n")  # v2's root group has no memory.events: the machine's
    assert oom_kills(str(tmp_path / "v2"), **args) == [str(vmstat), 7]
    assert oom_kills(str(tmp_path / "none"), proc_cgroup=str(proc), vmstat=str(tmp_path / "no-vmstat")) is None
