"""auralm.planning.link_budget against figures worked by hand, the link cache of cli.launch.plan.link_cache (a real file
under a temporary HOME or XDG_CACHE_HOME), and hrmctl train's warning as the launch's plan process
(auralm.planning.server) gives it."""

from __future__ import annotations

import io
import json
import math
import time

import pytest
from rich.console import Console

from auralm.planning import link_budget as lb
from cli.launch.plan import link_cache, planner
from cli.launch.plan.options import LaunchOptions
from cli.nodes.inventory import Node

MiB = 1024 ** 2


def test_slow_link_ddp_step_and_diloco_h_worked_by_hand():
    # 10.8M parameters: 43.2 MB of fp32 gradients in ceil(43.2e6 / 26214400) = 2 buckets. Two ranks: 2(n-1)/n = 1,
    # so at 25 MB/s bus bandwidth 43.2e6 / 25e6 = 1.728 s, plus 2 x 1 ms latency = 1.730 s per step.
    b = lb.budget(busbw_GBps=0.025, latency_us=1000, world=2, parameters=10_800_000, compute_s=0.5)
    assert b["ddp"]["bytes"] == 43_200_000 and b["ddp"]["buckets"] == 2
    assert b["ddp"]["comm_s"] == pytest.approx(1.730)
    assert b["ddp"]["ratio"] == pytest.approx(3.46)
    # the bf16 hook: half the bytes, the same 2 buckets: 0.864 + 0.002
    assert b["ddp_bf16"]["comm_s"] == pytest.approx(0.866)
    assert b["ddp_bf16"]["ratio"] == pytest.approx(1.732)
    # DiLoCo in bf16: 21.6 MB in one message, 0.864 + 0.001 = 0.865 s per sync; at most 5% of 0.5 s = 0.025 s a
    # step needs H >= 34.6, the smallest round H is 50. In int8, 1 + 4/256 bytes a parameter: 10.97 MB, 0.440 s, H >=
    # 17.6: 20. In int4, 1/2 + 4/256: 5,568,750 bytes, 0.22375 s, H >= 8.95: 10, the smallest: int4
    d = b["diloco"]
    bf16, int8 = d["by_compress"]["bf16"], d["by_compress"]["int8"]
    assert bf16["bytes_per_sync"] == 21_600_000 and bf16["comm_s_per_sync"] == pytest.approx(0.865)
    assert (bf16["inner_steps"], int8["inner_steps"]) == (50, 20)
    assert d["compress"] == "int4" and d["bytes_per_sync"] == 5_568_750 and d["inner_steps"] == 10
    assert d["comm_s_per_sync"] == pytest.approx(0.22375)
    assert d["comm_s_per_step"] == pytest.approx(0.022375) and d["ratio"] == pytest.approx(0.04475)
    # the sync (0.224 s) is covered by ceil(0.224 / 0.5) = 1 local step: overlap_steps=1
    assert d["overlap_steps"] == 1
    s = b["suggestion"]
    assert (s["sync"], s["inner_steps"], s["compress"], s["overlap_steps"]) == ("diloco", 10, "int4", 1)
    assert s["overrides"] == ["training.sync=diloco", "training.diloco.inner_steps=10",
                              "training.diloco.compress=int4", "training.diloco.overlap_steps=1"]
    assert "1.73 s" in b["text"] and "H=10" in b["text"] and "5.57 MB of int4 pseudo-gradient" in b["text"]
    assert "quantised to int4 (5.57 MB a round against 21.6 MB as bf16" in s["why"]
    assert "need H=10 where bf16's need 50" in s["why"] and "first 1 local step" in s["why"]
    # a fast enough link keeps bf16 (the least compressed that reaches the smallest H): no override of it
    b = lb.budget(busbw_GBps=0.1, latency_us=0, world=2, parameters=1_000_000, compute_s=0.12)
    assert b["diloco"]["compress"] == "bf16" and not any("compress" in o for o in b["suggestion"]["overrides"])
    # too slow for any H: the least time a round (int4), and the reason says the link is too slow
    b = lb.budget(busbw_GBps=1e-6, latency_us=0, world=2, parameters=100_000_000, compute_s=0.01)
    assert b["diloco"]["compress"] == "int4" and "too slow" in b["suggestion"]["why"]
    json.dumps(b)  # a plain, JSON-able dict


def test_three_ranks_use_the_ring_factor_and_plain_ddp_is_kept_when_communication_is_small():
    # 1M parameters, 4 MB in one bucket; 3 ranks send 2(3-1)/3 = 4/3 of it: 4e6 * 4/3 / 1e9 = 5.333 ms + 0.1 ms
    b = lb.budget(busbw_GBps=1.0, latency_us=100, world=3, parameters=1_000_000, compute_s=0.2)
    assert b["ddp"]["comm_s"] == pytest.approx(0.0054333, rel=1e-4)
    assert b["ddp"]["ratio"] == pytest.approx(0.0271667, rel=1e-4)
    assert b["suggestion"]["sync"] == "ddp" and b["suggestion"]["ddp_comm_hook"] == "none"
    assert b["suggestion"]["overrides"] == []


def test_the_bf16_hook_when_it_brings_ddp_under_the_threshold():
    # 4 MB at 100 MB/s: 40 ms against 200 ms of compute (20% > 15%); with bf16 20 ms (10%)
    b = lb.budget(busbw_GBps=0.1, latency_us=0, world=2, parameters=1_000_000, compute_s=0.2)
    assert b["ddp"]["ratio"] == pytest.approx(0.2) and b["ddp_bf16"]["ratio"] == pytest.approx(0.1)
    assert b["suggestion"]["ddp_comm_hook"] == "bf16"
    assert b["suggestion"]["overrides"] == ["training.ddp_comm_hook=bf16"]
    # just above the threshold with the hook too: DiLoCo
    b = lb.budget(busbw_GBps=0.1, latency_us=0, world=2, parameters=1_000_000, compute_s=0.12)
    assert b["ddp_bf16"]["ratio"] == pytest.approx(1 / 6) and b["suggestion"]["sync"] == "diloco"
    # 2 MB per sync = 20 ms; 5% of 120 ms = 6 ms a step: H >= 3.33, the smallest round H is 10; one step covers it
    assert b["diloco"]["inner_steps"] == 10 and b["diloco"]["overlap_steps"] == 1
    assert lb.overlap_steps(1.0, 0.1, 10) is None  # ten steps' compute would be needed: not less than the round


def test_a_link_too_slow_even_for_diloco_says_so():
    b = lb.budget(busbw_GBps=1e-6, latency_us=0, world=2, parameters=100_000_000, compute_s=0.01)
    assert b["diloco"]["inner_steps"] == lb.ROUND_H[-1] and b["diloco"]["ratio"] > lb.DILOCO_OK
    assert "too slow" in b["suggestion"]["why"]


def test_one_rank_and_unknown_compute():
    b = lb.budget(busbw_GBps=0.0, latency_us=10, world=1, parameters=1000, compute_s=0.1)
    assert b["ddp"]["comm_s"] == 0 and b["suggestion"]["overrides"] == []
    b = lb.budget(busbw_GBps=0.5, latency_us=10, world=2, parameters=1000, compute_s=None)
    assert b["suggestion"] is None and b["diloco"]["inner_steps"] is None and "unknown" in b["text"]


def test_the_link_is_the_best_of_the_two_largest_sizes():
    rows = [{"bytes": 1024, "busbw_GBps": 0.001}, {"bytes": 16 * MiB, "busbw_GBps": 0.7},
            {"bytes": 64 * MiB, "busbw_GBps": 0.65}]
    assert lb.link_from_rows(rows) == (0.7, 16 * MiB)
    assert lb.link_from_rows([{"bytes": 1024, "busbw_GBps": 0.0}]) is None  # a world of one


def test_powersgd_bytes_worked_by_hand():
    # each gradient as (first dimension, the rest); rank r = min(n, m, 2); P and Q when 2 (n + m) r < n m:
    # (1000, 500): 2 x 1500 = 3000 (6000 < 500000); (64, 3, 3, 3) as (64, 27): 2 x 91 = 182 (364 < 1728);
    # (10,) as (10, 1): r = 1, 11 elements would not halve 10: sent whole; (4, 4): 2 x 8 = 16 is not under 16/2
    shapes = [(1000, 500), (64, 3, 3, 3), (10,), (4, 4)]
    assert lb.powersgd_elements(shapes, 2) == 3000 + 182 + 10 + 16
    assert lb.powersgd_elements([(1000, 500)], 4) == 6000
    # 1M parameters whose factors are 100k elements: 400 kB at 100 MB/s on two ranks = 4 ms + 3 messages x 1 ms
    # (the whole tensors, then P, then Q, one after another) in DDP's one bucket, against 0.1 s of compute
    b = lb.budget(busbw_GBps=0.1, latency_us=1000, world=2, parameters=1_000_000, compute_s=0.1,
                  powersgd={"rank": 2, "elements": 100_000})
    low = b["ddp_powersgd"]
    assert low["bytes"] == 400_000 and low["comm_s"] == pytest.approx(0.007) and low["ratio"] == pytest.approx(0.07)
    assert [r[0] for r in lb.rows(b)] == ["ddp (fp32 gradients)", "ddp + bf16 hook", "ddp + powersgd r=2",
                                          "diloco H=10 (bf16, once per H)"]
    assert "PowerSGD at rank 2 sends 400 KB, 7 ms (7.0%" in b["text"]


PSGD_SCRIPT = """
import json, os, sys
import torch, torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook
from torch.nn.parallel import DistributedDataParallel
from auralm import models
from auralm.training import config

cfg = config.parse(sys.argv[2:])
arch = config.resolved_model(cfg.model)
vocab = 512 if cfg.task == "lm" else None
dist.init_process_group("gloo", rank=0, world_size=1)
model = models.build(cfg.task, arch, vocab)

class Touch(torch.nn.Module):  # a loss that reaches every parameter, whatever the model's own forward takes
    def __init__(self, inner):
        super().__init__()
        self.inner = inner
    def forward(self):
        return sum((p * p).sum() for p in self.inner.parameters())

# one bucket: torch's hook waits for its P and Q all-reduces inside callbacks on gloo's few worker threads, and
# with this loss every bucket is ready at the same moment; several such chains at once can take every thread and hang
ddp = DistributedDataParallel(Touch(model), bucket_cap_mb=1000)
state = powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=int(sys.argv[1]),
                                    start_powerSGD_iter=2)
ddp.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
for _ in range(3):  # two plain all-reduces, then one compressed step
    ddp().backward()
print(json.dumps({"sent": state.total_numel_after_compression, "before": state.total_numel_before_compression}),
      flush=True)
# the count is out: leave without the interpreter's teardown, in which gloo's worker threads still joinable have
# aborted the process ("terminate called without an active exception"), even after destroy_process_group
os._exit(0)
"""


@pytest.mark.parametrize("rank,overrides", [(2, ["task=lm", "model=tiny"]), (1, ["task=sudoku", "model=hrm-tiny"]),
                                            (4, ["task=sudoku", "model=trm-tiny"])])
@pytest.mark.slow  # seconds of real work (a training, hrmctl train, a compile): not in --fast (issue 35, item 6)
def test_powersgd_elements_are_what_torchs_hook_sends(tmp_path, rank, overrides):
    """torch's own powerSGD_hook on a real DDP (gloo, one process) counts the elements of its one compressed step."""
    import os
    import socket
    import subprocess
    import sys

    from auralm.planning import sizing
    from auralm.training import config
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    done = subprocess.run([sys.executable, "-c", PSGD_SCRIPT, str(rank), *overrides], capture_output=True, text=True,
                          env=env, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    counted = json.loads(done.stdout.strip().splitlines()[-1])
    cfg = config.parse(overrides)
    shapes = sizing.parameter_shapes(cfg.task, config.resolved_model(cfg.model), 512 if cfg.task == "lm" else None)
    assert counted["before"] == sum(math.prod(s) for s in shapes)
    assert lb.powersgd_elements(shapes, rank) == counted["sent"] < counted["before"]


def test_work_shares_join_the_suggestion_when_the_ranks_differ():
    # ranks at 0.1 s and 0.2 s a step: equal shares wait 0.2 s; shares by speed do the global batch in
    # 2 / (1/0.1 + 1/0.2) = 0.1333 s (1.5x the samples/s); a DiLoCo round goes at the fastest rank's 0.1 s a step
    bal = lb.shares([0.1, 0.2])
    assert bal["equal_s"] == 0.2 and bal["auto_s"] == pytest.approx(2 / 15) and bal["diloco_s"] == 0.1
    assert bal["gain"] == pytest.approx(1.5) and bal["suggest"]
    assert not lb.shares([0.1, 0.11])["suggest"] and lb.shares([0.1]) is None and lb.shares(None) is None
    # a fast link (1M parameters, 4 MB at 1 GB/s = 4 ms): plain DDP, with the shares, its ratio against 0.1333 s
    b = lb.budget(busbw_GBps=1.0, latency_us=0, world=2, parameters=1_000_000, compute_s=0.2,
                  compute_by_rank=[0.1, 0.2])
    s = b["suggestion"]
    assert (s["sync"], s["ddp_comm_hook"], s["balance"]) == ("ddp", "none", "auto")
    assert s["overrides"] == ["training.balance=auto"]
    assert b["ddp"]["ratio"] == pytest.approx(0.004 / (2 / 15)) and b["ddp"]["compute_s"] == pytest.approx(2 / 15)
    assert "1.50x the samples/s of equal shares" in s["why"]
    assert "plain DDP, work shares by speed: training.balance=auto" in b["text"]
    assert "0.133 s of compute with work shares (0.2 s with equal ones)" in b["text"]
    # a slow link: DiLoCo's H from the fastest rank's 0.1 s: 2 MB of bf16 at 25 MB/s = 80 ms a sync, 5% of 0.1 s
    # needs H >= 16: 20; int8's 1.02 MB (40.6 ms) H >= 8.1: 10; with the slowest rank's 0.2 s bf16's would be 10
    b = lb.budget(busbw_GBps=0.025, latency_us=0, world=2, parameters=1_000_000, compute_s=0.2,
                  compute_by_rank=[0.1, 0.2])
    assert b["diloco"]["inner_steps"] == 10 and b["diloco"]["compute_s"] == 0.1
    assert b["diloco"]["by_compress"]["bf16"]["inner_steps"] == 20
    assert b["suggestion"]["overrides"][:4] == ["training.balance=auto", "training.sync=diloco",
                                                "training.diloco.inner_steps=10", "training.diloco.compress=int8"]
    assert "fastest rank's 0.1 s a local step" in b["suggestion"]["why"]
    b = lb.budget(busbw_GBps=0.025, latency_us=0, world=2, parameters=1_000_000, compute_s=0.2)
    assert (b["diloco"]["inner_steps"], b["diloco"]["compress"]) == (10, "bf16")
    # equal enough: no shares suggested, nothing changes
    b = lb.budget(busbw_GBps=1.0, latency_us=0, world=2, parameters=1_000_000, compute_s=0.2,
                  compute_by_rank=[0.19, 0.2])
    assert b["suggestion"]["overrides"] == [] and b["ddp"]["compute_s"] == 0.2 and not b["balance"]["suggest"]


# ---------------------------------------------------------------- scaling the cached compute, and the warning

SMALL = {"name": "small", "parameters": 14_000_000, "batch_size": 16, "grad_accum": 1, "tokens_per_sample": 256,
         "spec": "small-spec"}


def _link(compute: dict, busbw: float = 0.025) -> dict:
    return {"nodes": ["node0", "node1"], "world": 2, "backend": "gloo", "busbw_GBps": busbw, "latency_us": 500.0,
            "measured_at": time.time() - 3 * 3600, "compute": compute}


def test_cached_compute_is_scaled_to_the_run():
    cached = {**SMALL, "s_per_step": 1.2}
    assert lb.scaled_compute(cached, dict(SMALL)) == (pytest.approx(1.2), False)  # the same model and batch
    assert lb.scaled_compute(cached, {**SMALL, "batch_size": 32, "grad_accum": 2}) == (pytest.approx(4.8), True)
    tiny = {"name": "tiny", "parameters": 700_000, "batch_size": 64, "grad_accum": 1, "tokens_per_sample": 64,
            "spec": "tiny-spec"}
    # 1.2 s x (0.7M x 64 x 64) / (14M x 16 x 256) = 1.2 x 0.05 x 1 = 0.06 s
    assert lb.scaled_compute(cached, tiny) == (pytest.approx(0.06), True)
    # a recurrent model runs its layers several times a step: TRM tiny (H_cycles 2, L_cycles 3) 2 x 4 = 8 forward
    # calls, the last 4 in the graph (a backward is two forwards): (8 + 2 x 4) / 3 = 16/3 passes
    from auralm.training import config
    trm = config.resolved_model(config.ModelConfig(name="trm-tiny"))
    hrm = config.resolved_model(config.ModelConfig(name="hrm-tiny"))
    assert lb.passes(trm, "trm") == pytest.approx(16 / 3)
    # HRM tiny: L (2 layers) 2 x 2 times and H (2 layers) 2 times, as 2 x (2 x 2 + 2) / 4 = 3 forwards, + 2: 5/3
    assert lb.passes(hrm, "hrm") == pytest.approx(5 / 3) and lb.passes({}, "gpt") == 1
    assert lb.scaled_compute(cached, {**tiny, "passes": 16 / 3}) == (pytest.approx(0.32), True)


def test_advise_warns_only_when_communication_dominates():
    link = _link({**SMALL, "s_per_step": 1.2})
    # 56 MB of fp32 gradients at 25 MB/s: 2.24 s + 3 buckets x 0.5 ms against 1.2 s
    a = lb.advise(link, dict(SMALL), world=2)
    assert a["warn"] and a["comm_s"] == pytest.approx(2.2415) and not a["estimated"]
    assert a["line"].startswith("node0,node1: DDP would spend ~2.24 s per step communicating")
    assert "1.2 s of compute (measured by test-ddp)" in a["line"] and "3 h ago" in a["line"]
    assert a["line"].endswith("try training.sync=diloco training.diloco.inner_steps=10 "
                              "training.diloco.compress=int8 training.diloco.overlap_steps=1")
    # a run of 100 steps has 10 rounds of 10: the trainer's default outer step (auto) is the ranks' average there, so
    # no override joins the suggestion, and the reason says so; 400 steps (40 rounds) have no such reason
    short = lb.advise(link, dict(SMALL, max_steps=100), world=2)
    assert short["line"] == a["line"] and "outer_lr=1" not in short["line"]
    assert "this run has 10 rounds: with so few the default outer step (training.diloco.outer_lr=auto) is the ranks' " \
           "plain average" in short["budget"]["suggestion"]["why"]
    assert "this run has" not in lb.advise(link, dict(SMALL, max_steps=400), world=2)["budget"]["suggestion"]["why"]
    assert lb.advise(link, dict(SMALL, max_steps=400), world=2)["line"] == a["line"]
    # with the bf16 hook already on: 1.12 s < 1.2 s, no warning
    assert not lb.advise(link, dict(SMALL), world=2, hook="bf16")["warn"]
    # DiLoCo already: nothing to say
    assert not lb.advise(link, dict(SMALL), world=2, sync="diloco")["warn"]
    # a fast link: no warning
    assert not lb.advise(_link({**SMALL, "s_per_step": 1.2}, busbw=1.0), dict(SMALL), world=2)["warn"]
    # PowerSGD is modelled too: 1.4M factor elements, 5.6 MB at 25 MB/s = 0.224 s + 9 x 0.5 ms: no warning
    psgd = dict(SMALL, powersgd={"rank": 2, "elements": 1_400_000})
    a = lb.advise(link, psgd, world=2, hook="powersgd")
    assert not a["warn"] and a["comm_s"] == pytest.approx(0.2285)
    a = lb.advise(_link({**SMALL, "s_per_step": 0.1}), psgd, world=2, hook="powersgd")
    assert a["warn"] and "as PowerSGD rank-2 factors" in a["line"]


def test_advise_warns_of_equal_shares_on_ranks_of_unequal_speed():
    # test-ddp timed the ranks at 0.6 s and 1.2 s; a fast link: the communication is fine, the shares are not
    link = _link({**SMALL, "s_per_step": 1.2, "s_per_step_by_rank": [0.6, 1.2]}, busbw=1.0)
    a = lb.advise(link, dict(SMALL), world=2)
    assert a["warn"] and a["line"] == ("node0,node1: the ranks compute a step in 0.6 s to 1.2 s (test-ddp 3 h ago) and "
                                       "this run gives them equal shares: every DDP step waits for the slowest; try "
                                       "training.balance=auto (about 1.50x the samples/s)")
    assert "every DiLoCo round waits" in lb.advise(link, dict(SMALL), world=2, sync="diloco")["line"]
    assert not lb.advise(link, dict(SMALL), world=2, balance="auto")["warn"]
    assert not lb.advise(link, dict(SMALL), world=2, balance="node0:2,node1:1")["warn"]
    # the times scale with the run's model: half the batch, half of each rank's time; the ratio stays
    a = lb.advise(link, dict(SMALL, batch_size=8), world=2)
    assert a["warn"] and "0.3 s to 0.6 s" in a["line"]
    # a slow link with shares by speed: the run's step is the balanced 0.8 s, against which 2.24 s dominates
    a = lb.advise(_link({**SMALL, "s_per_step": 1.2, "s_per_step_by_rank": [0.6, 1.2]}), dict(SMALL), world=2,
                  balance="auto")
    assert a["warn"] and a["ratio"] == pytest.approx(2.2415 / 0.8) and "against ~0.8 s of compute" in a["line"]


# ---------------------------------------------------------------- the cache file, and train's warning end to end


def test_diloco_wire_is_the_least_compressed_whose_round_fits_the_link():
    # 14M parameters at 25 MB/s, 1.2 s a step: bf16 (28 MB) 1.12 s, int8 (14.2 MB) 0.569 s, int4 (7.2 MB) 0.289 s a
    # round; a round may spend 5% of its compute: 3 s for H=50, 0.6 s for H=10, 0.3 s for H=5, 0.06 s for H=1
    b = lb.budget(busbw_GBps=0.025, latency_us=500.0, world=2, parameters=14_000_000, compute_s=1.2)
    assert [lb.compress_for(b, h)["compress"] for h in (50, 20, 10, 5, 1)] == ["bf16", "bf16", "int8", "int4", "int4"]
    assert lb.compress_for(b, 10)["why"] == ("a round of 10 steps computes for ~12 s; sent as int8 (14.2 MB) it takes "
                                             "~0.569 s on this link, within 5% of that; as bf16 ~1.12 s")
    assert "still over 5% of it (fewer bytes need a larger training.diloco.inner_steps)" in lb.compress_for(b, 1)["why"]
    assert lb.compress_for(lb.budget(busbw_GBps=0.025, latency_us=500.0, world=2, parameters=14_000_000,
                                     compute_s=None), 10) is None  # no compute measured: no choice
    link = _link({**SMALL, "s_per_step": 1.2})
    assert lb.advise(link, dict(SMALL), world=2, sync="diloco", inner_steps=10)["diloco_compress"]["compress"] == "int8"
    assert "diloco_compress" not in lb.advise(link, dict(SMALL), world=2)  # DDP: no rounds


def test_diloco_streaming_hides_a_round_that_does_not_fit_and_cuts_it_into_a_steps_traffic_each():
    # 14M parameters at 25 MB/s: bf16's 28 MB take 1.12 s a round, int4's 7.2 MB 0.29 s. At 1.2 s a step a round of
    # 50 (60 s) waits for int4's under 1% of its time: nothing to stream; bf16's 1.9%, and one step covers it:
    # overlapped, whole
    b = lb.budget(busbw_GBps=0.025, latency_us=500.0, world=2, parameters=14_000_000, compute_s=1.2)
    assert lb.fragments_for(b, 50, "int4") is None and lb.fragments_for(b, 50, "int8") is None  # int8: 0.95%
    s = lb.fragments_for(b, 50, "bf16")
    assert (s["fragments"], s["overlap_steps"]) == (1, 1) and s["why"] == (
        "a round of 50 steps computes for ~60 s and its all-reduce as bf16 (28 MB) takes ~1.12 s on this link, 1.9% "
        "of it: travelling during the 1 local step after the round, no rank waits for it")
    # at 0.1 s a step the round needs 12 steps of traffic: 12 parts of one step each, at H=50 and H=20 alike
    fast = lb.budget(busbw_GBps=0.025, latency_us=500.0, world=2, parameters=14_000_000, compute_s=0.1)
    for h in (50, 20):
        s = lb.fragments_for(fast, h, "bf16")
        assert (s["fragments"], s["overlap_steps"]) == (12, 1), s
        assert s["why"].endswith("in 12 parts of ~0.0934 s, each travelling during the 1 local step after it is "
                                 "sent, no rank waits for it and each part's outer step lands 1 local step late "
                                 "where the whole round's would land 12 late")
    # more parts than MAX_FRAGMENTS would need: the most, each overlapping more than one step
    s = lb.fragments_for(fast, 200, "none")  # fp32: 2.24 s, 23 steps
    assert (s["fragments"], s["overlap_steps"]) == (lb.MAX_FRAGMENTS, 2), s
    # a round shorter than its traffic: no split hides it, and the reason names the fix
    s = lb.fragments_for(fast, 10, "bf16")
    assert s["fragments"] is None and s["why"].endswith(
        "longer than its local steps can cover (12 of 10): a larger training.diloco.inner_steps (or fewer bytes) "
        "makes it fit")
    assert lb.fragments_for(lb.budget(busbw_GBps=0.025, latency_us=500.0, world=2, parameters=14_000_000,
                                      compute_s=None), 10, "bf16") is None  # no compute measured: no choice
    link = _link({**SMALL, "s_per_step": 0.1})
    streams = lb.advise(link, dict(SMALL), world=2, sync="diloco", inner_steps=20)["diloco_fragments"]
    assert set(streams) == {"none", "bf16", "int8", "int4"} and streams["bf16"]["fragments"] > 1


def _result(parameters: int, s_per_step: float, busbw: float, model: dict) -> dict:
    b = lb.budget(busbw_GBps=busbw, latency_us=500.0, world=2, parameters=parameters, compute_s=s_per_step)
    return {"world_size": 2, "backend": "gloo", "ok": True,
            "training": {**b, "bandwidth_bytes": 64 * MiB, "model": model,
                         "compute": {"steps_timed": 3, "s_per_step": s_per_step, "s_per_micro_batch": s_per_step,
                                     "s_by_rank": [s_per_step, s_per_step * 0.9],
                                     "s_per_step_by_rank": [s_per_step, s_per_step * 0.9], "error": None}}}


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.delenv("HRMCTL_CACHE", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    return tmp_path


def test_cache_round_trip_under_home_and_xdg(home, monkeypatch):
    model = {"name": "small", "task": "lm", "parameters": 14_000_000, "batch_size": 16, "grad_accum": 1,
             "tokens_per_sample": 256, "vocab": 8192, "spec": "s"}
    path = link_cache.save(link_cache.entry_from_result(_result(14_000_000, 1.2, 0.025, model), ["node1", "node0"]))
    assert path == home / ".cache" / "hrmctl" / "links.json"
    entry = link_cache.load(["node0", "node1"])
    assert entry == json.loads(path.read_text())["node0,node1"]
    assert entry["busbw_GBps"] == 0.025 and entry["latency_us"] == 500.0 and entry["world"] == 2
    assert entry["compute"] == {"s_per_step": 1.2, "steps_timed": 3, "s_per_step_by_rank": [1.2, 1.08], **model}
    assert link_cache.load(["node0", "node2"]) is None
    monkeypatch.setenv("XDG_CACHE_HOME", str(home / "xdg"))
    assert link_cache.cache_path() == home / "xdg" / "hrmctl" / "links.json" and link_cache.load(["node0", "node1"]) is None
    # a result without a compute time (--no-bandwidth, a probe that failed) or of one rank is not cached
    assert link_cache.entry_from_result({"world_size": 2, "ok": True, "training": None}, ["a", "b"]) is None
    bad = _result(1000, 1.0, 0.025, model)
    bad["training"]["compute"]["s_per_step"] = None
    assert link_cache.entry_from_result(bad, ["a", "b"]) is None


def _nodes() -> list[Node]:
    return [Node(name="node0", host="10.0.0.1", user="u"), Node(name="node1", host="10.0.0.2", user="u")]


@pytest.mark.slow  # seconds of real work (a training, hrmctl train, a compile): not in --fast (issue 35, item 6)
def test_train_warning_from_the_cache_end_to_end(home, monkeypatch):
    """A real cache file, the real plan process (auralm.planning.server) sizing the run's model (model=small task=lm)."""
    # hrmctl train gives the advice 20 s and then goes on without it; on a loaded shared test machine the
    # subprocess (a torch import) took longer and the advice was None: this test waits for it
    monkeypatch.setattr(link_cache, "ADVICE_TIMEOUT_S", 180)
    overrides = ["model=small", "task=lm", "training.batch_size=16"]
    model = {"name": "small", "task": "lm", "parameters": 13_891_584, "batch_size": 16, "grad_accum": 1,
             "tokens_per_sample": 256, "vocab": 8192, "spec": None}
    link_cache.save(link_cache.entry_from_result(_result(13_891_584, 1.2, 0.025, model), ["node0", "node1"]))
    out = io.StringIO()
    advice = link_cache.start(LaunchOptions(nodes=_nodes(), args=overrides))
    doc = link_cache.warn(advice, Console(file=out, width=400))
    assert doc["warn"] and doc["parameters"] == 13_891_584  # GPT small with the 8192 vocabulary
    # 55.6 MB at 25 MB/s = 2.22 s + 3 x 0.5 ms; the cached spec (None) differs: scaled by parameters x tokens (1.2 s)
    assert doc["comm_s"] == pytest.approx(13_891_584 * 4 / 25e6 + 0.0015) and doc["estimated"]
    line = out.getvalue().strip()
    assert line.startswith("warning: node0,node1: DDP would spend ~2.22 s per step communicating")
    assert "(estimate: scaled from the model small at batch 16 measured by test-ddp)" in line
    assert line.endswith("try training.sync=diloco training.diloco.inner_steps=10 training.diloco.compress=int8 "
                         "training.diloco.overlap_steps=1")
    assert "\n" not in line
    # DiLoCo asked for: nothing to say of the communication, and the ranks' speeds (1.2 s, 1.08 s) are close
    doc = link_cache.warn(link_cache.start(LaunchOptions(nodes=_nodes(), args=overrides + ["training.sync=diloco"])),
                     Console(file=io.StringIO()))
    assert doc is not None and doc["sync"] == "diloco" and not doc["warn"]
    # DiLoCo of H=10 that leaves its wire to hrmctl: int8 on this link (a round's 12 s of compute; bf16's 28 MB take
    # 1.1 s, over 5% of it), added to the run's overrides and said; given by the user: left as given
    opts = LaunchOptions(nodes=_nodes(), args=overrides + ["training.sync=diloco", "training.diloco.inner_steps=10"])
    out = io.StringIO()
    # and its ~0.57 s (4.7% of the round) travel during the next local step: no rank waits for them
    assert link_cache.choose_wire(link_cache.start(opts), opts, Console(file=out, width=400)) == \
        {"compress": "int8", "fragments": 1, "overlap_steps": 1}
    assert opts.args[-2:] == ["training.diloco.compress=int8", "training.diloco.overlap_steps=1"]
    assert opts.trainer.training.diloco.compress == "int8"
    assert out.getvalue().startswith("diloco: rounds sent as int8, chosen from test-ddp's figures for node0,node1: a "
                                     "round of 10 steps computes for ~")
    assert out.getvalue().splitlines()[0].endswith("training.diloco.compress=bf16 keeps bf16")
    assert out.getvalue().splitlines()[1].startswith("diloco: training.diloco.overlap_steps=1, chosen from test-ddp's "
                                                     "figures for node0,node1: a round of 10 steps computes for ~")
    given = LaunchOptions(nodes=_nodes(), args=opts.args[:-2] + ["training.diloco.compress=none"])
    # fp32's 55.6 MB take ~2.2 s, over 5% of the round and within two of its steps: two parts of a step's traffic,
    # each travelling during the step after it; a run that sets its overlap (or its parts) is left as given
    out = io.StringIO()
    assert link_cache.choose_wire(link_cache.start(given), given, Console(file=out, width=400)) == \
        {"fragments": 2, "overlap_steps": 1}
    assert given.args[-3:] == ["training.diloco.compress=none", "training.diloco.fragments=2",
                               "training.diloco.overlap_steps=1"]
    assert out.getvalue().startswith("diloco: training.diloco.fragments=2 training.diloco.overlap_steps=1, chosen "
                                     "from test-ddp's figures for node0,node1: a round of 10 steps computes for ~")
    assert out.getvalue().rstrip().endswith("training.diloco.fragments=1 training.diloco.overlap_steps=0 keeps the "
                                            "defaults")
    mine = LaunchOptions(nodes=_nodes(), args=given.args[:-2] + ["training.diloco.overlap_steps=2"])
    assert link_cache.choose_wire(link_cache.start(mine), mine, Console(file=io.StringIO())) == {}
    assert mine.args[-1] == "training.diloco.overlap_steps=2"
    # one node, or no entry for these nodes: nothing started, nothing printed
    assert link_cache.start(LaunchOptions(nodes=_nodes()[:1], args=overrides)) is None
    assert link_cache.start(LaunchOptions(nodes=[_nodes()[0], Node(name="x", host="h", user="u")], args=overrides)) is None
    # a fast link: the advice runs, but says nothing
    link_cache.save(link_cache.entry_from_result(_result(13_891_584, 1.2, 2.0, model), ["node0", "node1"]))
    out = io.StringIO()
    doc = link_cache.warn(link_cache.start(LaunchOptions(nodes=_nodes(), args=overrides)), Console(file=out))
    assert doc is not None and not doc["warn"] and out.getvalue() == ""


def test_advice_that_is_late_is_said_not_dropped_quietly():
    """The advice process (an import of torch) not done within its time: the launch goes on and says so; a dry run
    (which launches nothing) waits longer than a launch."""
    assert link_cache.ADVICE_DRY_RUN_TIMEOUT_S > link_cache.ADVICE_TIMEOUT_S
    planner.close()  # a plan process started by an earlier test could answer (refuse) this at once: a new one imports torch
    advice = link_cache.advise({"nodes": ["node0", "node1"]}, ["model=tiny"], None, timeout_s=0.01)
    out = io.StringIO()
    assert link_cache.warn(advice, Console(file=out, width=400)) is None and advice.late
    assert out.getvalue().startswith("note: no advice from test-ddp's figures for these nodes: the estimate took over")
