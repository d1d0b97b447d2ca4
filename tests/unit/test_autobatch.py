"""training.batch_size=auto (auralm.planning.autobatch) and the out-of-memory line (auralm.training.train.main)."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap

import pytest
import torch

from auralm.planning import autobatch
from auralm.training import config, train
from auralm.errors import UserError
from node.cgroups import cgroup_memory
from tests.trainer.helpers import REPO, python_env, tiny_args

pytestmark = pytest.mark.usefixtures("one_thread")

PLAN = re.compile(r"^batch_size=auto: rank (\d+) fits (\d+) \((.*)\), using (\d+) x accum (\d+) x (\d+) ranks = (\d+)$",
                  re.M)


@pytest.fixture(scope="module")
def sudoku_dir(sudoku_data):
    return sudoku_data(1200)


# ---------------------------------------------------------------- the key


def test_batch_size_auto_is_a_value_of_the_integer_key():
    assert config.parse(["training.batch_size=auto"]).training.batch_size == config.AUTO
    assert config.parse(["training.batch_size=AUTO", "training.global_batch_size=64"]).training.batch_size == 0
    assert config.parse(["training.batch_size=32"]).training.batch_size == 32
    with pytest.raises(UserError, match=r"training.batch_size=0: must be greater than 0 \(or auto"):
        config.parse(["training.batch_size=0"])
    with pytest.raises(UserError, match="expected an integer or auto"):
        config.parse(["training.batch_size=big"])
    with pytest.raises(UserError, match="training.memory_limit_gb=-1.0: must not be negative"):
        config.parse(["training.memory_limit_gb=-1"])


def test_the_torch_free_check_accepts_auto_without_importing_torch():
    res = subprocess.run([sys.executable, "-X", "importtime", "-m", "auralm.training.command_line", "training.batch_size=auto",
                          "training.memory_limit_gb=1.5"], capture_output=True, text=True, env=python_env(), cwd=REPO)
    assert res.returncode == 0, res.stderr[-2000:]
    assert not re.search(r"\|\s+torch$", res.stderr, re.M)  # -X importtime: one line per module imported
    bad = subprocess.run([sys.executable, "-m", "auralm.training.command_line", "training.batch_size=0"], capture_output=True,
                         text=True, env=python_env(), cwd=REPO)
    assert bad.returncode == 2 and "must be greater than 0 (or auto" in bad.stderr


# ---------------------------------------------------------------- the arithmetic


def test_grad_accum_keeps_the_global_batch():
    assert config.split_global_batch(100, 2, 64, 1) == (32, 1)  # fits the whole share: no accumulation
    assert config.split_global_batch(5, 2, 64, 1) == (4, 8)  # 32 a rank, at most 5 a micro-batch: 4 x 8
    assert config.split_global_batch(7, 3, 96, 1) == (4, 8)  # 32 a rank: the smallest accum dividing it with batch <= 7
    assert config.split_global_batch(1, 4, 64, 1) == (1, 16)
    for fits, world, total in [(13, 2, 200), (3, 3, 99), (50, 1, 50), (9, 4, 128)]:
        batch, accum = config.split_global_batch(fits, world, total, 1)
        assert batch <= fits and batch * accum * world == total
    assert config.split_global_batch(24, 2, 0, 1) == (24, 1)  # no global batch: the probed one, accum as configured
    assert config.split_global_batch(24, 2, 0, 3) == (24, 3)
    with pytest.raises(UserError, match="does not split into 3 ranks"):
        config.split_global_batch(8, 3, 64, 1)


def test_the_plan_line():
    fit = autobatch.Fit(37, "budget 0.10 GB")
    assert autobatch.plan_text(1, fit, 32, 2, 2) == \
        "batch_size=auto: rank 1 fits 37 (budget 0.10 GB), using 32 x accum 2 x 2 ranks = 128"


def test_cgroup_limits_are_read_from_v1_and_v2_and_their_ancestors(tmp_path):
    mem = tmp_path / "memory" / "outer" / "inner"
    mem.mkdir(parents=True)
    (tmp_path / "memory" / "outer" / "memory.limit_in_bytes").write_text("1000000000\n")
    (tmp_path / "memory" / "outer" / "memory.usage_in_bytes").write_text("300000000\n")
    (mem / "memory.limit_in_bytes").write_text("600000000\n")
    (mem / "memory.usage_in_bytes").write_text("250000000\n")
    (mem / "memory.stat").write_text("cache 1\ntotal_inactive_file 50000000\n")
    proc = tmp_path / "cgroup"
    proc.write_text("4:memory:/outer/inner\n3:cpu:/\n")
    assert cgroup_memory(str(tmp_path), str(proc))[1] == 600_000_000 - 200_000_000  # the tighter: inner
    (mem / "memory.limit_in_bytes").write_text("9223372036854771712\n")  # no limit there: the outer's counts
    assert cgroup_memory(str(tmp_path), str(proc))[1] == 700_000_000
    v2 = tmp_path / "v2"
    (v2 / "job").mkdir(parents=True)
    (v2 / "job" / "memory.max").write_text("500000000\n")
    (v2 / "job" / "memory.current").write_text("100000000\n")
    (v2 / "memory.max").write_text("max\n")
    proc.write_text("0::/job\n")
    assert cgroup_memory(str(v2), str(proc))[1] == 400_000_000
    proc.write_text("0::/\n")
    assert cgroup_memory(str(v2), str(proc))[1] is None  # "max": no limit


# ---------------------------------------------------------------- the CPU probe, on real memory


def test_the_cpu_fit_stays_inside_the_budget_it_measured():
    """A probe whose rows cost 8 MB each (touched, so resident): the batch chosen for 200 MB of headroom
    keeps the probe's real growth within 80% of it, and is not far below what would fit."""
    row = 8 << 20
    held = []

    def probe(b: int) -> None:
        t = torch.ones(b * row // 4)  # written: resident
        held.append(float(t[-1]))
        del t

    fit = autobatch.fit_cpu(probe, 200 << 20, 0, cap=10_000, what="a test's 200 MB")
    assert 12 <= fit.batch <= 20, fit  # 160 MB / 8 MB = 20, less the process's own noise
    assert "budget 0.17 GB = 80% of a test's 200 MB" in fit.limit
    base = autobatch.rss_bytes()
    autobatch._reset_peak()
    probe(fit.batch)
    assert autobatch._peak_rss() - base <= 0.8 * (200 << 20) + (4 << 20)  # a page-rounding's slack
    assert autobatch.fit_cpu(probe, 200 << 20, 0, cap=5, what="x").batch == 5  # the cap
    with pytest.raises(UserError, match="even one row needs about"):
        autobatch.fit_cpu(probe, 4 << 20, 0, cap=100, what="4 MB")


def test_memory_malloc_holds_after_a_larger_step_does_not_inflate_the_fit():
    """Freed memory kept by malloc (auralm.planning.cpu_memory, as in training) is given back before the probes: a probe
    reusing it would show no growth and promise any batch."""
    from auralm.planning import cpu_memory

    cpu_memory.keep_freed_memory()
    blocks = [torch.ones(1 << 20) for _ in range(100)]  # 400 MB in 4 MB blocks (below the mmap threshold)
    for b in blocks:
        b.add_(1)
    del blocks, b

    def probe(b: int) -> None:
        blocks = [torch.ones(1 << 20) for _ in range(2 * b)]  # 8 MB a row, in 4 MB blocks
        del blocks

    assert 12 <= autobatch.fit_cpu(probe, 200 << 20, 0, cap=10_000, what="200 MB").batch <= 20


def test_memory_limit_gb_and_the_environment_bound_the_headroom(monkeypatch):
    monkeypatch.delenv(autobatch.MEMORY_ENV, raising=False)
    free, what = autobatch.cpu_headroom(0, 1)
    assert free > 0 and "available" in what
    rss = autobatch.rss_bytes() / 1e9
    free, what = autobatch.cpu_headroom(rss + 0.1, 1)
    assert 0.05e9 < free <= 0.1e9 and what.startswith(f"memory_limit_gb {rss + 0.1:g}")
    monkeypatch.setenv(autobatch.MEMORY_ENV, f"{rss + 0.05:.3f}")
    free, _ = autobatch.cpu_headroom(rss + 0.1, 1)  # the smaller of the two
    assert free <= 0.05e9 + 1e6
    monkeypatch.setenv(autobatch.MEMORY_ENV, "lots")
    with pytest.raises(UserError, match="HRMCTL_MEMORY_LIMIT_GB='lots'"):
        autobatch.cpu_headroom(0, 1)


# ---------------------------------------------------------------- the trainer


def _auto_run(sudoku_dir, out, capsys, more_gb, *extra):
    """A tiny run with batch_size=auto, allowed ``more_gb`` above what this process holds now."""
    limit = f"training.memory_limit_gb={autobatch.rss_bytes() / 1e9 + more_gb:.3f}"
    train.run(config.parse(tiny_args(sudoku_dir, out, "training.batch_size=auto", "training.max_steps=2", limit,
                                     *extra)))
    text = capsys.readouterr().out
    plans = PLAN.findall(text)
    assert len(plans) == 1, text
    return [int(v) if v.isdigit() else v for v in plans[0]], text


@pytest.mark.slow  # seconds of real work (a training, hrmctl train, a compile): not in --fast (issue 35, item 6)
def test_auto_batch_follows_the_memory_budget_and_keeps_the_global_batch(sudoku_dir, tmp_path, capsys):
    (rank, fits, limit, batch, accum, world, total), _ = _auto_run(sudoku_dir, tmp_path / "small", capsys, 0.25)
    assert (rank, world, accum, batch, total) == (0, 1, 1, fits, fits)
    assert limit.startswith("budget 0.0") and "memory_limit_gb" in limit and "128 MiB for the rest of the run" in limit
    (_, fits_big, _, _, _, _, _), _ = _auto_run(sudoku_dir, tmp_path / "big", capsys, 0.8)
    assert 1 <= fits < fits_big  # more memory, a larger batch
    # the same small budget with a global batch: grad_accum makes it up
    (_, fits2, _, batch, accum, _, total), text = _auto_run(sudoku_dir, tmp_path / "global", capsys, 0.25,
                                                            f"training.global_batch_size={4 * fits_big}")
    assert total == 4 * fits_big and batch <= fits2 and batch * accum == total and accum > 1
    saved = __import__("json").loads((tmp_path / "global" / "config.json").read_text())
    assert (saved["training"]["batch_size"], saved["training"]["grad_accum"]) == (batch, accum)
    assert f"schedule: {batch} per rank x {accum} x 1 ranks = {total} a step" in text


# ---------------------------------------------------------------- out of memory: one line, exit 2


@pytest.mark.slow  # seconds of real work (a training, hrmctl train, a compile): not in --fast (issue 35, item 6)
def test_running_out_of_cpu_memory_is_one_line_saying_what_to_lower(sudoku_dir, tmp_path):
    """A real allocation failure: the trainer under an address-space limit 1.5 GB above what it holds after
    importing torch, a 10M-parameter model at 1024 rows a micro-batch (about 13 MB of activations a row)."""
    code = textwrap.dedent(f"""
        import resource, sys
        from auralm.training import train
        size = next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith("VmSize:"))
        resource.setrlimit(resource.RLIMIT_AS, (size + 1_500_000_000, size + 1_500_000_000))
        sys.exit(train.main({tiny_args(sudoku_dir, tmp_path / 'run', 'model=small', 'training.batch_size=1024',
                                       'training.max_steps=1')!r}))
    """)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path,
                         env=python_env(), timeout=300)
    assert res.returncode == 2, res.stdout + res.stderr
    lines = res.stderr.strip().splitlines()
    assert "Traceback" not in res.stderr, res.stderr
    assert lines[-1] == ("error: rank 0: out of CPU memory: lower training.batch_size (now 1024) "
                         "(training.global_batch_size holds with a larger training.grad_accum), or set "
                         "training.batch_size=auto (the largest that fits), or training.grad_checkpoint=true"), lines


def test_what_counts_as_out_of_memory():
    assert train.out_of_memory(MemoryError())
    assert train.out_of_memory(RuntimeError("[enforce fail at alloc_cpu.cpp:121] data. DefaultCPUAllocator: "
                                            "can't allocate memory: you tried to allocate 123 bytes."))
    assert train.out_of_memory(torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert not train.out_of_memory(RuntimeError("Connection closed by peer"))
    cfg = config.parse(["training.batch_size=8"])
    cfg.training._auto = True
    line = train.oom_line(3, torch.cuda.OutOfMemoryError("x"), cfg)
    assert line.startswith("error: rank 3: out of CUDA memory: training.batch_size=auto chose 8")


# ---------------------------------------------------------------- hrmctl train --dry-run


@pytest.mark.slow  # seconds of real work (a training, hrmctl train, a compile): not in --fast (issue 35, item 6)
def test_train_dry_run_estimates_the_batch_that_fits_each_node(tmp_path):
    res = subprocess.run([sys.executable, "-m", "cli", "train", "--dry-run", "model=trm-tiny", "training.batch_size=auto",
                          "global_batch_size=100000"], capture_output=True, text=True, timeout=120, env=python_env(),
                         cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.strip().splitlines()
    assert lines[-3].startswith("# model trm-tiny: 0.43M parameters; per rank about ") and "a row" in lines[-3]
    m = re.fullmatch(r"# (\S+): batch_size=auto: about (\d+) rows per rank fit \(80% of ([\d.]+) GiB RAM available; "
                     r"estimated, each rank measures at start\)", lines[-2])
    assert m, lines[-2]
    fits = int(m.group(2))
    m = re.fullmatch(r"# batch_size=auto plan: (\d+) x accum (\d+) x 1 ranks = 100000", lines[-1])
    assert m and int(m.group(1)) <= fits and int(m.group(1)) * int(m.group(2)) == 100000, lines[-1]
    res = subprocess.run([sys.executable, "-m", "cli", "train", "--dry-run", "--json", "model=trm-tiny",
                          "training.batch_size=auto"], capture_output=True, text=True, timeout=120, env=python_env(),
                         cwd=tmp_path)
    doc = __import__("json").loads(res.stdout)
    assert doc["model"]["batch_size"] == "auto" and abs(doc["auto_batch"]["batch_size"] - fits) < 0.1 * fits
    (node,) = doc["auto_batch"]["nodes"].values()
    assert node["fits"] == doc["auto_batch"]["batch_size"] and node["memory"] == "ram" and node["memory_gb"] > 0


def test_a_rank_killed_while_the_nodes_oom_kill_count_grew_is_said_to_have_run_out_of_memory():
    from cli.launch.run.attempt import killed_by

    assert killed_by("rank 0 on node1", "node1", 9, oom=True) == (
        "rank 0 on node1 was killed by SIGKILL: node1 ran out of memory (the kernel's OOM killer; lower "
        "training.batch_size, or use training.batch_size=auto, the largest that fits, or "
        "training.grad_checkpoint=true)")
    assert killed_by("rank 0 on node1", "node1", 9) == \
        "rank 0 on node1 was killed by SIGKILL (out of memory? see `dmesg` on node1)"
