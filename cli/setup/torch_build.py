"""Which torch build a node gets: the CUDA build its driver can run where `nvidia-smi` shows a GPU, else the CPU build.

The version is always this machine's (`2.13.0` of `2.13.0+cpu`); only the local tag (`+cpu`, `+cu128`) and the
index it comes from differ. A node's driver says, in `nvidia-smi`'s header, the newest CUDA it can run
("CUDA Version: 12.8"); the build chosen is the newest of CUDA_BUILDS not newer than that. A driver older than
every build gets the CPU build, and the reason says to update the driver.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass

INDEX = "https://download.pytorch.org/whl/{tag}"
# PyTorch's CUDA builds of the 2.x releases this project pins (newest first): the tag and the CUDA it needs.
CUDA_BUILDS = (("cu130", (13, 0)), ("cu128", (12, 8)), ("cu126", (12, 6)))

_CUDA = re.compile(r"CUDA Version:\s*(\d+)\.(\d+)")
_DRIVER = re.compile(r"Driver Version:\s*([0-9.]+)")
_GPU_ROW = re.compile(r"^\|\s+\d+\s+(.+?)\s{2,}(?:On|Off)\s+\|", re.M)


@dataclass
class TorchBuild:
    requirement: str      # torch==2.13.0+cu128
    tag: str              # cpu, cu128
    index: str            # where that build is published
    why: str              # one line: what the node showed and why this build

    @property
    def cuda(self) -> bool:
        return self.tag != "cpu"

    def as_dict(self) -> dict:
        return asdict(self)


def base_version(version: str) -> str:
    """2.13.0+cpu -> 2.13.0"""
    return version.split("+", 1)[0]


def parse_nvidia_smi(text: str | None) -> dict | None:
    """The driver, the CUDA it runs and the GPUs from `nvidia-smi`'s plain output; None without a GPU."""
    if not text:
        return None
    cuda, driver = _CUDA.search(text), _DRIVER.search(text)
    gpus = [g.strip() for g in _GPU_ROW.findall(text)]
    if cuda is None or not gpus:
        return None
    return {"cuda": (int(cuda.group(1)), int(cuda.group(2))), "driver": driver.group(1) if driver else None,
            "gpus": gpus}


def choose(torch_version: str, nvidia_smi: str | None) -> TorchBuild:
    """The build for a node from its `nvidia-smi` output (None or empty: no NVIDIA GPU)."""
    version = base_version(torch_version)
    smi = parse_nvidia_smi(nvidia_smi)
    if smi is None:
        return TorchBuild(f"torch=={version}+cpu", "cpu", INDEX.format(tag="cpu"),
                          "no NVIDIA GPU (nvidia-smi absent or shows none): CPU build")
    major, minor = smi["cuda"]
    shown = f"{smi['gpus'][0]}{' x%d' % len(smi['gpus']) if len(smi['gpus']) > 1 else ''}, driver " \
            f"{smi['driver'] or '?'} (CUDA {major}.{minor})"
    for tag, need in CUDA_BUILDS:
        if (major, minor) >= need:
            return TorchBuild(f"torch=={version}+{tag}", tag, INDEX.format(tag=tag),
                              f"nvidia-smi: {shown}: the newest CUDA build it runs is {tag}")
    oldest = CUDA_BUILDS[-1][1]
    return TorchBuild(f"torch=={version}+cpu", "cpu", INDEX.format(tag="cpu"),
                      f"nvidia-smi: {shown} is older than torch {version}'s CUDA builds need (CUDA "
                      f"{oldest[0]}.{oldest[1]}): CPU build; update the NVIDIA driver for the GPU build")



if __name__ == "__main__":  # scripts/install.sh: `python3 cli/setup/torch_build.py 2.13.0` -> tag, index, why
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a script: the checkout's node/ package
    from node.setup import nvidia_smi  # the node side's reading of nvidia-smi

    chosen = choose(sys.argv[1], nvidia_smi())
    print(chosen.tag, chosen.index, chosen.why, sep="\n")
