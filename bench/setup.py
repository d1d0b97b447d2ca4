"""`hrmctl setup` of two bare lab nodes against the same steps done by hand, in the same run.

    python bench/setup.py [--pip-too]

Four bare lab nodes (an empty home each). node0 and node1: `hrmctl setup` as a user runs it (one command, its
own process). node2 and node3, by hand, both at once as a user would do them in two terminals: `rsync -a` of the
same checkout and of the same wheels over ssh, then over ssh `python3 -m venv ~/hrmctl/.venv` and
`pip install --no-index --find-links <wheels> -r lock.txt torch==...` (the same lock, the same wheels).
The wheels are downloaded here first (once per machine: not counted for either side; their time is printed).
Then the no-op second `hrmctl setup`. With --pip-too, also `hrmctl setup --pip` on two more nodes (the same
installer as the hand steps). Ratio: hrmctl / by hand (target <= 1.2). Root only (it makes lab nodes).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from cli.setup import local  # noqa: E402
from cli.setup.torch_build import choose  # noqa: E402
from lab.nodes import Lab  # noqa: E402


def hrmctl_setup(lab: Lab, nodes: str, *extra: str) -> tuple[float, dict]:
    dirty = ["--allow-dirty"] if subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain",
                                                 "--untracked-files=no"], capture_output=True,
                                                text=True).stdout.strip() else []
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "cli", "setup", "--nodes", nodes, "--json", *dirty, *extra],
                          capture_output=True, text=True, env=dict(os.environ, HRMCTL_INVENTORY=str(lab.inventory)),
                          cwd=ROOT)
    seconds = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"hrmctl setup failed ({proc.returncode}): {proc.stderr.strip()[-800:]}")
    return seconds, json.loads(proc.stdout)


def by_hand(lab: Lab, name: str, src: Path, wheels: Path, torch_req: str) -> None:
    node = lab.node(name)
    ssh = (f"ssh -i {lab.key} -o UserKnownHostsFile={lab.known_hosts} -o StrictHostKeyChecking=yes "
           "-o BatchMode=yes")
    target = f"{node.user}@{node.ip}"
    steps = [["rsync", "-a", "-e", ssh, f"{src}/", f"{target}:hrmctl/"],
             ["rsync", "-a", "--mkpath", "-e", ssh, f"{wheels}/", f"{target}:.cache/hrmctl/wheels/"],
             [*ssh.split(), target, "python3 -m venv ~/hrmctl/.venv && PIP_CONFIG_FILE=/dev/null "
              "~/hrmctl/.venv/bin/pip install -q --disable-pip-version-check --no-index --find-links "
              f"~/.cache/hrmctl/wheels --no-deps -r ~/.cache/hrmctl/wheels/lock.txt '{torch_req}'"]]
    for argv in steps:
        proc = subprocess.run(argv, capture_output=True, text=True)
        if proc.returncode != 0:
            raise SystemExit(f"by hand on {name}: {argv[0]} failed: {proc.stderr.strip()[-500:]}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pip-too", action="store_true", help="also hrmctl setup --pip on two more nodes")
    args = ap.parse_args()
    t0 = time.perf_counter()
    co = local.checkout(allow_dirty=True)
    lock = local.package_lock()
    build = choose(lock.torch_version, None)
    py = lock.python
    wheels = local.wheel_set(lock, build, py, use_uv=True)
    hand_wheels = local.wheel_set(lock, build, py, use_uv=False)  # the same, less uv
    prepare = time.perf_counter() - t0
    out: dict = {"packages": len(lock.lines) + 1, "wheels_mb": round(sum(p.stat().st_size for p in wheels.glob("*.whl"))
                                                                   / 1e6, 1), "prepare_here_s": round(prepare, 1)}
    with Lab(6 if args.pip_too else 4, bare=True) as lab:
        out["hrmctl_setup_s"], _ = hrmctl_setup(lab, "node0,node1")
        t0 = time.perf_counter()
        threads = [threading.Thread(target=by_hand, args=(lab, n, co.staged, hand_wheels, build.requirement))
                   for n in ("node2", "node3")]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        out["by_hand_s"] = time.perf_counter() - t0
        out["second_setup_s"], doc = hrmctl_setup(lab, "node0,node1")
        out["second_setup_per_node_s"] = [r["seconds"] for r in doc["nodes"]]
        if args.pip_too:
            out["hrmctl_setup_pip_s"], _ = hrmctl_setup(lab, "node4,node5", "--pip")
        report(out)  # before the lab goes: removing four venvs takes minutes here


def report(out: dict) -> None:
    out["ratio"] = out["hrmctl_setup_s"] / out["by_hand_s"]
    if "hrmctl_setup_pip_s" in out:
        out["ratio_pip"] = out["hrmctl_setup_pip_s"] / out["by_hand_s"]
    print(json.dumps({k: round(v, 2) if isinstance(v, float) else v for k, v in out.items()}, indent=2))
    print(f"first setup of 2 nodes: hrmctl setup {out['hrmctl_setup_s']:.1f} s, by hand (rsync + pip install) "
          f"{out['by_hand_s']:.1f} s: ratio {out['ratio']:.2f} (target <= 1.2); no-op second run "
          f"{out['second_setup_s']:.1f} s ({out['second_setup_per_node_s']} s per node)", flush=True)


if __name__ == "__main__":
    main()
