"""Helpers for the trainer's tests: small data, the run's records, and real multi-process runs.

``run_ranks`` starts ``world`` separate processes (as separate nodes would be) that join
one gloo process group through MASTER_ADDR/MASTER_PORT and run ``auralm.training.train.run``; each rank
writes what the test needs to see (its final weights, the inputs its model saw, how many
optimizer steps it took) into the test's directory.
"""

from __future__ import annotations

import gc
import json
import os
import socket
import sys
import traceback
from pathlib import Path

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook
import torch.multiprocessing as mp

from lab import SITE_DIR

REPO = Path(__file__).resolve().parents[2]
QUIJOTE = REPO.parent / "shared" / "data" / "quijote" / "pg2000.txt"


def prepare_data(args: list[str]) -> int:
    """``hrmctl prepare-data ARGS`` in this process: its exit code (its lines go to this process's stdout and
    stderr, as the command prints them)."""
    from cli.app import main

    return main(["prepare-data", *args])


def small_sudoku(out: Path, count: int = 1200) -> Path:
    from auralm.data.datadir import prepare_sudoku

    prepare_sudoku(out, count=count, seed=1, min_givens=50, max_givens=60)
    return out


def records(run_dir: Path, name: str = "metrics.jsonl") -> list[dict]:
    path = Path(run_dir) / name
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def by_step(run_dir: Path) -> dict[int, dict]:
    return {r["step"]: r for r in records(run_dir)}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tiny_args(data_dir: Path, out_dir: Path, *extra: str) -> list[str]:
    """A tiny sudoku run with a record of every step."""
    return [f"data_dir={data_dir}", f"out_dir={out_dir}", "model=tiny", "training.batch_size=16",
            "logging.curves=false",
            "training.log_interval=1", "training.eval_interval=0", "training.checkpoint_interval=0",
            "training.warmup_steps=5", *extra]


def _rank_main(rank: int, world: int, port: int, args: list[str], result_dir: str, opts: dict) -> None:
    os.environ.clear()  # the test's environment now (the fork server's is the one it started with)
    os.environ.update(opts["parent_env"])
    for fd, name in ((1, "out"), (2, "err")):  # the fork server's own stdout is not the test's: run_ranks passes it on
        with open(Path(result_dir) / f"rank{rank}.{name}", "wb") as f:
            os.dup2(f.fileno(), fd)
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK="0", LOCAL_WORLD_SIZE="1",
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    os.environ.update(opts.get("env", [{}] * world)[rank])
    torch.set_num_threads(1)
    from auralm import models
    from auralm.data import datadir
    from auralm.training import command_line, distributed, train

    if str(rank) in opts.get("fake_probe", {}):  # the one faked part: what this rank's device can do
        distributed.probe_device = lambda local_rank: opts["fake_probe"][str(rank)]
    if "sudoku_count" in opts:  # a smaller embedded default data set, to keep the test short
        datadir.SUDOKU_DEFAULTS.update(train=opts["sudoku_count"], test=max(1, opts["sudoku_count"] // 10))
    if "cwd" in opts:
        Path(opts["cwd"][rank]).mkdir(parents=True, exist_ok=True)
        os.chdir(opts["cwd"][rank])
    seen: list[bytes] = []  # every input row the model was trained on (a spy: records, changes nothing)
    halted: list[list[bool]] = []  # ACT models: which rows of the carry halted before each training segment

    probing = [False]  # the probe of the run's time (train.measure_rate): its passes train nothing, so not recorded
    measure = train.measure_rate

    def unrecorded_probe(*a, **kw):
        probing[0] = True
        try:
            return measure(*a, **kw)
        finally:
            probing[0] = False

    train.measure_rate = unrecorded_probe

    def record_inputs(module, inputs):
        if probing[0]:
            return
        if module.training and isinstance(module, (models.SudokuNet, models.GPT)):
            seen.extend(row.numpy().tobytes() for row in inputs[0])
        if module.training and isinstance(module, models.ACT) and inputs:
            halted.append(inputs[0].halted.tolist())

    synced: list[list[torch.Tensor]] = []  # DiLoCo: this rank's own weights at the end of each round
    if opts.get("spy_sync"):
        from auralm.parallel import diloco

        start = diloco.DiLoCo.start

        def spy(self, *a, **kw):
            synced.append([p.detach().clone() for p in self.params])
            return start(self, *a, **kw)

        diloco.DiLoCo.start = spy
    steps = [0]
    first_grads: dict[int, torch.Tensor] = {}  # the gradients the first optimizer step was given

    def record_first_grads(opt, a, k):
        if not first_grads:
            for i, p in enumerate(p for g in opt.param_groups for p in g["params"]):
                if p.grad is not None:
                    first_grads[i] = p.grad.detach().clone()

    torch.nn.modules.module.register_module_forward_pre_hook(record_inputs)
    register_optimizer_step_pre_hook(record_first_grads)
    register_optimizer_step_post_hook(lambda opt, a, k: steps.__setitem__(0, steps[0] + 1))
    out = {"rank": rank}
    try:
        if opts.get("setup_only"):
            d = distributed.setup(command_line.parse(args).backend, 60)
            out.update(backend=d.backend, why=d.why, device=str(d.device), exit=0)
        else:
            model = train.run(command_line.parse(args))
            out.update(state=model.state_dict(), seen=seen, halted=halted, optimizer_steps=steps[0],
                       first_grads=first_grads, synced=synced, exit=0)
    except Exception as e:
        out.update(error=f"{type(e).__name__}: {e}", traceback=traceback.format_exc(), exit=1)
    torch.save(out, Path(result_dir) / f"rank{rank}.pt")


def run_ranks(world: int, args: list[str], result_dir: Path, timeout: float = 300, **opts) -> list[dict]:
    """Run the trainer on ``world`` ranks (real processes, real gloo); each rank's result.

    opts: fake_probe={"0": {...}} (what probe_device answers on that rank), cwd=[dir per rank],
    env=[{...} per rank] (more environment, e.g. HRMCTL_JOB naming the rank's node),
    sudoku_count=N (size of the generated default data), setup_only=True (stop after the backend choice).
    """
    result_dir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    opts = dict(opts, parent_env=dict(os.environ))
    procs = [_forked().Process(target=_rank_main, args=(r, world, port, args, str(result_dir), opts))
             for r in range(world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout)
    for p in procs:
        if p.is_alive():
            p.kill()
    results = []
    for r in range(world):
        for fd, name in ((1, "out"), (2, "err")):  # what the rank printed, where a spawned rank's would have gone
            printed = result_dir / f"rank{r}.{name}"
            if printed.exists():
                os.write(fd, printed.read_bytes())
        path = result_dir / f"rank{r}.pt"
        assert path.exists(), f"rank {r} wrote no result (exit code {procs[r].exitcode})"
        results.append(torch.load(path, weights_only=False))
    return results


def _forked():
    """Ranks forked from multiprocessing's fork server, which imports torch and the trainer once per test process:
    each rank is still a fresh process of its own (nothing of the test's state), as spawning would give, without
    paying `import torch` again (1.5 s of CPU a rank; the trainer tier starts about a hundred ranks), nor torch's
    compiler (torch._dynamo), which every rank imports at its optimizer's first step (about 1 s of CPU)."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "torch._dynamo", "auralm.training.train", __name__])
    return ctx


def python_env(**extra: str) -> dict:
    """The environment for a trainer subprocess: this checkout importable, one thread per process."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), str(SITE_DIR)]), OMP_NUM_THREADS="1", **extra)
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "HRMCTL_BACKEND"):
        if k not in extra:
            env.pop(k, None)
    return env


PYTHON = sys.executable


# torch's and the trainer's objects, imported above, are left out of the collector's passes: in the fork server
# (which imports this module last, _forked) each rank inherits them frozen, so its collections neither scan them nor
# touch (and so copy) the pages they lie on
gc.freeze()
