"""hrmctl-top-sampler: what one node is doing, one JSON line per interval on stdout.

Sent over SSH with the rest of node/ and run by the node's own Python (`python -u -c ship.program("sampler")
--interval 1`; its client: cli/top/watch.py),
with the standard library, psutil when it is installed (else /proc, on Linux and WSL), and NVIDIA's
NVML through nvidia-ml-py (`import pynvml`) when that is installed (else no GPU: "gpus": null).
It stops when its stdin closes (the SSH channel or the local pipe went away) or stdout breaks,
or after --count lines.

Each line: {"v", "t" (the node's time), "host", "cores", "cpu" (% of the whole machine), "per_core",
"mem_used", "mem_total" (bytes; used = total - available), "net_tx", "net_rx" (bytes/s, every
interface but loopback), "gpus" (null, or [{"index", "name", "util", "mem_used", "mem_total"}]),
"gpu_error", "ranks" (the trainer's processes of this user: pid, rank, local_rank, world, run, cwd,
cpu (% of one core), rss, and from the rank's progress file, auralm/training/progress_file.py: step, loss,
steps_per_s, rate, unit, age), "agent_cpu" (this agent's CPU time / wall time since its first
line, %), "psutil" (whether psutil was used)}.

A trainer process is one whose first `-m` module is auralm.training.train (torchrun's worker, or a plain
`python -m auralm.training.train`), never torchrun itself; its rank and run come from its progress file, and before
its first from its environment (RANK, LOCAL_RANK, WORLD_SIZE, HRMCTL_RUN_ID), readable because it runs as the same
user (a rank forked from torchrun's agent, lab/forked_ranks.py, the suite's, shows the agent's there: rank 0 until its
first progress file).
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time

from node.lines import say

TRAINER_MODULES = ("auralm.training.train",)
RESCAN_S = 5.0  # command lines are cached per pid; forget the cache this often (pids are reused)
try:
    import psutil  # type: ignore
except ImportError:
    psutil = None


def _read(path: str) -> str | None:
    try:
        with open(path, "rb") as fh:
            return fh.read().decode("utf-8", "replace")
    except OSError:
        return None


# ---------------------------------------------------------------- the machine

class Machine:
    """CPU, memory and network counters; each call of sample() gives the rates since the previous one."""

    def __init__(self) -> None:
        self.cores = os.cpu_count() or 1
        self.prev_cpu = None
        self.prev_net = None
        self.prev_t = None

    def _cpu_times(self) -> list[tuple[float, float]]:
        """(busy, total) per core."""
        if psutil is not None:
            out = []
            for c in psutil.cpu_times(percpu=True):
                total = sum(c)
                # guest time is already counted in user time on Linux
                total -= getattr(c, "guest", 0.0) + getattr(c, "guest_nice", 0.0)
                idle = c.idle + getattr(c, "iowait", 0.0)
                out.append((total - idle, total))
            return out
        out = []
        for line in (_read("/proc/stat") or "").splitlines():
            if line.startswith("cpu") and line[3:4].isdigit():
                f = [float(x) for x in line.split()[1:9]]  # user nice system idle iowait irq softirq steal
                f += [0.0] * (8 - len(f))
                total = sum(f)
                out.append((total - f[3] - f[4], total))
        return out

    def _net(self) -> tuple[int, int]:
        """(bytes sent, bytes received) over every interface but loopback."""
        tx = rx = 0
        if psutil is not None:
            for name, c in psutil.net_io_counters(pernic=True).items():
                if name != "lo" and not name.startswith("Loopback"):
                    tx, rx = tx + c.bytes_sent, rx + c.bytes_recv
            return tx, rx
        for line in (_read("/proc/net/dev") or "").splitlines()[2:]:
            name, _, rest = line.partition(":")
            f = rest.split()
            if name.strip() != "lo" and len(f) >= 9:
                rx, tx = rx + int(f[0]), tx + int(f[8])
        return tx, rx

    def _mem(self) -> tuple[int | None, int | None]:
        if psutil is not None:
            vm = psutil.virtual_memory()
            return vm.total - vm.available, vm.total
        info = {}
        for line in (_read("/proc/meminfo") or "").splitlines():
            key, _, value = line.partition(":")
            parts = value.split()
            if parts:
                info[key] = int(parts[0]) * 1024
        total = info.get("MemTotal")
        avail = info.get("MemAvailable", info.get("MemFree"))
        return (total - avail if total is not None and avail is not None else None), total

    def sample(self) -> dict:
        now = time.monotonic()
        cpu, net = self._cpu_times(), self._net()
        out: dict = {"cores": self.cores, "cpu": None, "per_core": None, "net_tx": None, "net_rx": None}
        if self.prev_cpu is not None and len(self.prev_cpu) == len(cpu):
            per = []
            for (b0, t0), (b1, t1) in zip(self.prev_cpu, cpu):
                dt = t1 - t0
                per.append(round(min(100.0, max(0.0, 100.0 * (b1 - b0) / dt)), 1) if dt > 0 else 0.0)
            out["per_core"] = per
            out["cpu"] = round(sum(per) / len(per), 1) if per else None
        if self.prev_net is not None and now > self.prev_t:
            dt = now - self.prev_t
            out["net_tx"] = round(max(0, net[0] - self.prev_net[0]) / dt, 1)
            out["net_rx"] = round(max(0, net[1] - self.prev_net[1]) / dt, 1)
        self.prev_cpu, self.prev_net, self.prev_t = cpu, net, now
        out["mem_used"], out["mem_total"] = self._mem()
        return out


# ---------------------------------------------------------------- GPUs

class Gpus:
    """NVML through nvidia-ml-py, imported on first use; None when it is missing or finds no driver."""

    def __init__(self) -> None:
        self.nvml = None
        self.handles: list = []
        self.error: str | None = None
        try:
            import pynvml  # type: ignore
        except ImportError:
            self.error = "no pynvml (pip install nvidia-ml-py)"
            return
        try:
            pynvml.nvmlInit()
            self.handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
            self.nvml = pynvml
        except Exception as exc:  # NVMLError: no driver, no device
            self.error = f"NVML: {exc}"

    def sample(self) -> list | None:
        if self.nvml is None:
            return None
        out = []
        for i, h in enumerate(self.handles):
            row: dict = {"index": i, "name": None, "util": None, "mem_used": None, "mem_total": None}
            try:
                name = self.nvml.nvmlDeviceGetName(h)
                row["name"] = name.decode() if isinstance(name, bytes) else name
                row["util"] = self.nvml.nvmlDeviceGetUtilizationRates(h).gpu
                mem = self.nvml.nvmlDeviceGetMemoryInfo(h)
                row["mem_used"], row["mem_total"] = mem.used, mem.total
            except Exception as exc:
                row["error"] = str(exc)
            out.append(row)
        return out


# ---------------------------------------------------------------- the trainer's ranks

def _module(cmdline: list[str]) -> str | None:
    """The module a Python command line runs (`python [-u ...] -m MODULE ...`), or None."""
    skip = False
    for i, arg in enumerate(cmdline[1:], 1):
        if skip:  # the value of -W or -X
            skip = False
            continue
        if arg == "-m" and i + 1 < len(cmdline):
            return cmdline[i + 1]
        if arg.startswith("-m") and len(arg) > 2:
            return arg[2:]
        if arg in ("-W", "-X"):
            skip = True
            continue
        if arg == "-c" or not arg.startswith("-"):
            return None  # a script or -c code: not a module run
    return None


class Ranks:
    """Finds this user's trainer processes and reads each one's progress file."""

    def __init__(self) -> None:
        self.uid = os.getuid() if hasattr(os, "getuid") else None
        self.me = os.getpid()
        self.cmdlines: dict[int, list[str] | None] = {}
        self.rescanned = 0.0
        self.info: dict[int, dict] = {}  # pid -> environment facts, read once
        self.cpu: dict[int, tuple[float, float]] = {}  # pid -> (cpu seconds, monotonic time)
        self.boot = None  # boot time (/proc/stat btime), for a process's start time without psutil
        if psutil is None:
            btime = [l for l in (_read("/proc/stat") or "").splitlines() if l.startswith("btime ")]
            self.boot = float(btime[0].split()[1]) if btime else None

    def _pids(self) -> list[int]:
        if psutil is not None:
            return psutil.pids()
        return [int(p) for p in os.listdir("/proc") if p.isdigit()]

    def _cmdline(self, pid: int) -> list[str] | None:
        if psutil is not None:
            try:
                return psutil.Process(pid).cmdline()
            except Exception:
                return None
        raw = _read(f"/proc/{pid}/cmdline")
        return raw.rstrip("\0").split("\0") if raw else None

    def _owned(self, pid: int) -> bool:
        if self.uid is None:
            return True
        if psutil is not None:
            try:
                return psutil.Process(pid).uids().real == self.uid
            except Exception:
                return False
        try:
            return os.stat(f"/proc/{pid}").st_uid == self.uid
        except OSError:
            return False

    def _environ(self, pid: int) -> dict:
        if psutil is not None:
            try:
                return psutil.Process(pid).environ()
            except Exception:
                return {}
        raw = _read(f"/proc/{pid}/environ") or ""
        return dict(kv.split("=", 1) for kv in raw.split("\0") if "=" in kv)

    def _cwd(self, pid: int) -> str | None:
        try:
            return psutil.Process(pid).cwd() if psutil is not None else os.readlink(f"/proc/{pid}/cwd")
        except Exception:
            return None

    def _usage(self, pid: int) -> tuple[float | None, int | None, float | None]:
        """(cpu seconds, rss bytes, start time as time.time()) of a process."""
        if psutil is not None:
            try:
                p = psutil.Process(pid)
                with p.oneshot():
                    t = p.cpu_times()
                    return t.user + t.system, p.memory_info().rss, p.create_time()
            except Exception:
                return None, None, None
        stat = _read(f"/proc/{pid}/stat")
        if not stat:
            return None, None, None
        f = stat.rsplit(")", 1)[-1].split()  # f[0] is field 3 of proc(5): utime 14, stime 15, starttime 22, rss 24
        tick = os.sysconf("SC_CLK_TCK")
        started = self.boot + int(f[19]) / tick if self.boot is not None else None
        return (int(f[11]) + int(f[12])) / tick, int(f[21]) * os.sysconf("SC_PAGE_SIZE"), started

    def trainers(self) -> list[int]:
        now = time.monotonic()
        if now - self.rescanned > RESCAN_S:
            self.cmdlines.clear()
            self.rescanned = now
        pids = self._pids()
        alive = set(pids)
        for pid in list(self.cmdlines):
            if pid not in alive:
                del self.cmdlines[pid]
        for pid in list(self.info):
            if pid not in alive:
                self.info.pop(pid, None)
                self.cpu.pop(pid, None)
        found = []
        for pid in pids:
            if pid == self.me:
                continue
            if pid not in self.cmdlines:
                cmd = self._cmdline(pid)
                # torchrun (and a process forked but not yet exec'd) is read again each time
                launcher = cmd is not None and _torchrun(cmd)
                if not launcher:
                    self.cmdlines[pid] = cmd
            else:
                cmd = self.cmdlines[pid]
            if cmd and _module(cmd) in TRAINER_MODULES and self._owned(pid):
                found.append(pid)
        return found

    def sample(self) -> list[dict]:
        out = []
        now = time.monotonic()
        for pid in self.trainers():
            info = self.info.get(pid)
            if info is None:
                env = self._environ(pid)
                base = env.get("TMPDIR") or ("/tmp" if os.path.isdir("/tmp") else None)
                if base is None:
                    import tempfile
                    base = tempfile.gettempdir()
                uid = self.uid if self.uid is not None else env.get("USERNAME", "user")
                cmd = self.cmdlines.get(pid) or []
                out_dir = next((a.split("=", 1)[1] for a in cmd if a.startswith("out_dir=")), None)
                info = {"rank": _int(env.get("RANK"), 0), "local_rank": _int(env.get("LOCAL_RANK"), 0),
                        "world": _int(env.get("WORLD_SIZE"), 1), "run": env.get("HRMCTL_RUN_ID"),
                        "cwd": self._cwd(pid), "out_dir": out_dir,
                        "progress": os.path.join(base, f"hrmctl-top-{uid}", f"{pid}.json")}
                self.info[pid] = info
            row = {"pid": pid, **{k: v for k, v in info.items() if k != "progress"}}
            secs, rss, started = self._usage(pid)
            prev = self.cpu.get(pid)
            row["cpu"] = None
            if secs is not None:
                if prev is not None and now > prev[1]:
                    row["cpu"] = round(max(0.0, 100.0 * (secs - prev[0]) / (now - prev[1])), 1)
                self.cpu[pid] = (secs, now)
            row["rss"] = rss
            row.update(step=None, loss=None, steps_per_s=None, rate=None, unit=None, age=None, round_bytes=None)
            text = _read(info["progress"])
            if text:
                try:
                    beat = json.loads(text)
                except ValueError:
                    beat = None  # never half-written (renamed into place), but be safe
                if isinstance(beat, dict) and beat.get("pid") == pid and \
                        (started is None or beat.get("time", 0) >= started - 1):
                    for key in ("step", "loss", "steps_per_s", "rate", "unit", "round_bytes"):
                        row[key] = beat.get(key)
                    for key in ("rank", "local_rank", "world"):  # the trainer's own word
                        if isinstance(beat.get(key), int):
                            row[key] = beat[key]
                    row["age"] = round(max(0.0, time.time() - beat.get("time", time.time())), 2)
                    row["run"] = row["run"] or beat.get("run")
            out.append(row)
        out.sort(key=lambda r: (r["rank"], r["pid"]))
        return out


def _torchrun(cmd: list[str]) -> bool:
    """torchrun's agent: ``python -m torch.distributed.run`` or hrmctl's ``python -m node torchrun``."""
    return any("torch.distributed.run" in a for a in cmd) or any(
        cmd[i:i + 3] == ["-m", "node", "torchrun"] for i in range(len(cmd) - 2))


def _int(text, default: int) -> int:
    try:
        return int(text)
    except (TypeError, ValueError):
        return default


# ---------------------------------------------------------------- the loop

def _watch_stdin() -> None:
    """Leave when stdin closes: the channel that started us is gone."""
    try:
        while sys.stdin.buffer.read(4096):
            pass
    except Exception:
        pass
    os._exit(0)


def main(argv: list[str]) -> int:
    interval, count, first = 1.0, 0, 0.5
    it = iter(argv)
    for arg in it:
        if arg == "--interval":
            interval = max(0.05, float(next(it)))
        elif arg == "--count":
            count = int(next(it))
        elif arg == "--first":
            first = float(next(it))
    threading.Thread(target=_watch_stdin, daemon=True).start()
    machine, ranks, gpus = Machine(), Ranks(), Gpus()
    host = socket.gethostname()
    machine.sample()
    ranks.sample()  # the first CPU reading of each rank
    time.sleep(min(interval, first))  # rates need two readings: the first line comes soon, not after a whole interval
    cpu0, wall0 = None, None
    sent = 0
    next_at = time.monotonic()
    while True:
        doc = {"v": 1, "t": time.time(), "host": host, **machine.sample(), "gpus": gpus.sample(),
               "gpu_error": gpus.error, "ranks": ranks.sample(), "psutil": psutil is not None}
        t = os.times()
        if cpu0 is None:
            cpu0, wall0 = t.user + t.system, time.monotonic()
            doc["agent_cpu"] = None
        else:
            wall = time.monotonic() - wall0
            doc["agent_cpu"] = round(100.0 * (t.user + t.system - cpu0) / wall, 3) if wall > 0 else None
        try:
            say(doc)
        except (OSError, ValueError):  # the reader is gone
            return 0
        sent += 1
        if count and sent >= count:
            return 0
        next_at += interval
        delay = next_at - time.monotonic()
        if delay < 0:  # fell behind (a suspended laptop): start counting again from now
            next_at, delay = time.monotonic(), 0
        time.sleep(delay)

