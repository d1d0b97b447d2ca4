"""hrmctl init and the parts of hrmctl setup that need no node: the torch build from a recorded nvidia-smi, the
distribution's command, the node side's venv switch and stamp (run here on real files)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from node import setup as node_setup
from cli.setup.distro import install_command
from cli.setup.torch_build import choose

ROOT = Path(__file__).resolve().parents[2]
SMI = (ROOT / "tests" / "recorded" / "nvidia-smi-rtx4090.txt").read_text()


def test_torch_build_from_a_recorded_nvidia_smi():
    gpu = choose("2.13.0+cpu", SMI)
    assert (gpu.requirement, gpu.index) == ("torch==2.13.0+cu128", "https://download.pytorch.org/whl/cu128")
    assert "RTX 4090" in gpu.why and "570.133.07" in gpu.why
    newer = choose("2.13.0", SMI.replace("CUDA Version: 12.8", "CUDA Version: 13.1"))
    assert newer.tag == "cu130"
    old = choose("2.13.0+cu128", SMI.replace("CUDA Version: 12.8", "CUDA Version: 12.2"))
    assert old.requirement == "torch==2.13.0+cpu" and "update the NVIDIA driver" in old.why
    for none in (None, "", "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."):
        cpu = choose("2.13.0+cpu", none)
        assert cpu.requirement == "torch==2.13.0+cpu" and cpu.index.endswith("/whl/cpu")


def test_the_distributions_command():
    assert install_command('ID=debian\nPRETTY_NAME="Debian GNU/Linux 12"\n')[1] == \
        "sudo apt-get install -y python3 python3-venv"
    assert install_command("ID=linuxmint\nID_LIKE=\"ubuntu debian\"\n")[1].startswith("sudo apt-get")
    assert install_command('ID="fedora"\n')[1] == "sudo dnf install -y python3"
    assert install_command("")[1].startswith("install Python >= 3.10")


def test_switch_replaces_a_real_venv_directory_with_a_link(tmp_path):
    link = tmp_path / ".venv"
    (link / "bin").mkdir(parents=True)
    new = tmp_path / ".venv-abc-1"
    (new / "bin").mkdir(parents=True)
    node_setup.switch(str(link), str(new))
    assert link.is_symlink() and os.readlink(link) == ".venv-abc-1"
    assert [p.name for p in tmp_path.glob(".venv.previous-*")], "the old directory was not kept aside"
    newer = tmp_path / ".venv-def-2"
    newer.mkdir()
    node_setup.switch(str(link), str(newer))
    assert os.readlink(link) == ".venv-def-2"


def test_finish_removes_what_the_older_commit_had_and_writes_the_stamp(tmp_path):
    (tmp_path / "cli").mkdir()
    for rel in ("cli/kept.py", "cli/gone.py", "mine.txt"):
        (tmp_path / rel).write_text("x")
    (tmp_path / node_setup.STAMP).write_text(json.dumps({"commit": "old", "files": ["cli/kept.py", "cli/gone.py",
                                                                                  "../outside"]}))
    answer = node_setup.finish({"workdir": str(tmp_path), "stamp": {"commit": "new"}, "files": ["cli/kept.py"]})
    assert answer["removed"] == ["cli/gone.py"]
    assert (tmp_path / "cli/kept.py").exists() and (tmp_path / "mine.txt").exists()
    assert json.loads((tmp_path / node_setup.STAMP).read_text()) == {"commit": "new", "files": ["cli/kept.py"]}


def _init(tmp_path, *args, home=None):
    env = dict(os.environ, HOME=str(home or tmp_path))
    env.pop("HRMCTL_INVENTORY", None)
    return subprocess.run([sys.executable, "-m", "cli", "init", *args], capture_output=True, text=True, cwd=tmp_path,
                          env=env, timeout=120)


def test_init_writes_the_inventory_and_refuses_to_overwrite_it(tmp_path):
    proc = _init(tmp_path, "--hosts", "192.168.1.10,aura@laptop1:2222", "--no-check")
    assert proc.returncode == 0, proc.stderr
    text = (tmp_path / "hrmctl.toml").read_text()
    assert '[nodes.192-168-1-10]\nhost = "192.168.1.10"' in text
    assert '[nodes.laptop1]\nhost = "laptop1"\nuser = "aura"\nport = 2222' in text
    assert 'python = "~/hrmctl/.venv/bin/python"' in text
    nodes = subprocess.run([sys.executable, "-m", "cli", "nodes", "--json"], capture_output=True, text=True,
                           cwd=tmp_path, env=dict(os.environ, HOME=str(tmp_path)), timeout=120)
    assert nodes.returncode == 0, nodes.stderr  # what init writes, the schema takes
    again = _init(tmp_path, "--hosts", "other", "--no-check")
    assert again.returncode == 2 and "--force" in again.stderr and len(again.stderr.strip().splitlines()) == 1
    assert (tmp_path / "hrmctl.toml").read_text() == text
    forced = _init(tmp_path, "--hosts", "other", "--no-check", "--force")
    assert forced.returncode == 0 and '[nodes.other]' in (tmp_path / "hrmctl.toml").read_text()


def test_init_from_ssh_config_and_a_failed_login_says_the_fix(tmp_path):
    ssh = tmp_path / ".ssh"
    ssh.mkdir()
    (ssh / "config").write_text("Host gpu-box\n  HostName 127.0.0.1\n  Port 1\n\nHost *\n  User aura\n")
    proc = _init(tmp_path)
    text = (tmp_path / "hrmctl.toml").read_text()
    assert "[nodes.gpu-box]\n# host, user, port and key: from its Host entry" in text and "*" not in text.split("[nodes")[1]
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "gpu-box: cannot connect to 127.0.0.1:1" in proc.stderr and "hrmctl setup" in proc.stderr


@pytest.mark.parametrize("hosts", ["a,,b", "a b", "a,a", "x:99999"])
def test_init_bad_hosts_are_one_line(tmp_path, hosts):
    proc = _init(tmp_path, "--hosts", hosts, "--no-check")
    assert proc.returncode == 2 and proc.stderr.startswith("error: --hosts") and "Traceback" not in proc.stderr
    assert not (tmp_path / "hrmctl.toml").exists()
