"""The trainer's optimizers (auralm.training.optim: torch's AdamW, and SGD for DiLoCo's outer step) on two real ranks
started as torchrun starts them: they step, save and load, and the ranks stay in step."""

from __future__ import annotations

import subprocess
import sys

from tests.trainer.helpers import free_port, python_env, records, tiny_args


def test_a_ddp_run_and_an_outer_step_save_load_and_keep_the_ranks_in_step(sudoku_data, tmp_path):
    """The trainer on two ranks, each a fresh process as torchrun starts them (DDP's constructor and forwards,
    AdamW's steps, gradient clipping, a checkpoint with the optimizer's state), then DiLoCo's outer SGD on each."""
    args = tiny_args(sudoku_data(200), tmp_path / "run", "training.max_steps=3", "training.checkpoint_interval=3")
    code = ("import sys, torch\n"
            "from auralm.training import train\n"
            f"assert train.main({args!r}) == 0\n"
            "p = torch.nn.Parameter(torch.ones(3)); p.grad = torch.ones(3)\n"
            "outer = torch.optim.SGD([p], lr=0.7, momentum=0.9, nesterov=True); outer.step(); outer.zero_grad()\n"
            "outer.load_state_dict(outer.state_dict())\n"
            "print('matplotlib imported:', 'matplotlib' in sys.modules)\n")
    world = dict(WORLD_SIZE="2", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                 MASTER_PORT=str(free_port()))
    ranks = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=python_env(RANK=str(r), **world)) for r in range(2)]
    try:  # one rank failing leaves the other waiting for it: killed below, not left behind
        for rank in ranks:
            out, err = rank.communicate(timeout=300)
            assert rank.returncode == 0, err[-2000:]
            assert out.splitlines()[-1:] == ["matplotlib imported: False"], out[-1000:]
    finally:
        for rank in ranks:
            if rank.poll() is None:
                rank.kill()
                rank.communicate()
    assert [p.name for p in (tmp_path / "run").rglob("checkpoint-*")] == ["checkpoint-3"]
    assert not (tmp_path / "run" / "curves.png").exists()  # logging.curves=false (tiny_args): no picture drawn
    checksums = [e for e in records(tmp_path / "run", "events.jsonl") if e["kind"] == "checksum"]
    assert len(checksums[0]["checksums"]) == 2 and checksums[0]["equal"], checksums  # two ranks, in step
