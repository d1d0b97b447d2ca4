"""The launcher's memory decision before launch (cli/launch/plan/memory.py): each rank's planned memory
(auralm.planning.sizing's
estimate) against its node's share of what the probe reported, and the override that fits (issue 33, item 9)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from auralm.training.config import split_global_batch
from cli.errors import HrmctlError
from cli.launch.plan import memory
from cli.launch.plan.options import LaunchOptions
from cli.launch.plan.plan import NodeFacts

GIB = 1 << 30


def hrm_50m(**over) -> dict:
    """auralm.planning.sizing's answer for the HRM launcher's `model=50m task=lm` (world 1), measured."""
    res = subprocess.run([sys.executable, "-m", "auralm.planning.sizing", "--json", "--world", "1", "model=50m",
                          "task=lm", *[f"{k}={v}" for k, v in over.items()]], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


@pytest.fixture(scope="module")
def size():
    return hrm_50m()


def test_the_hrm_launchers_50m_at_the_default_batch_is_refused_on_22_gib_with_the_batch_that_fits(size):
    assert size["batch_size"] == 64 and round((size["states_bytes"] + size["activation_bytes"]) / GIB, 2) == 42.67
    shares = memory.shares([("node1", 1)], {"node1": NodeFacts(mem_available_gb=22.0)})
    line = memory.verdict(size, 1, shares)
    fits = int((0.8 * 22 * GIB - size["states_bytes"]) // size["activation_bytes_per_row"])
    batch, accum = split_global_batch(fits, 1, 64, 1)
    assert (fits, batch, accum) == (25, 16, 4)
    assert line == ("node1: model hrm-50m at training.batch_size=64 needs about 42.67 GiB a rank (0.79 weights, "
                    "gradients and optimizer states, 41.88 activations); node1 has 22.0 GiB RAM available; fix: "
                    "training.batch_size=16 training.grad_accum=4 (the same 64 rows a step, about 11.26 GiB a rank), "
                    "or training.batch_size=auto (about 25 rows a rank fit 80% of it; measured at start)"), line
    # the override fits by the same estimate
    assert size["states_bytes"] + batch * size["activation_bytes_per_row"] <= 0.8 * 22 * GIB
    assert memory.verdict(hrm_50m(**{"training.batch_size": 16, "training.grad_accum": 4}), 1, shares) is None


def test_ranks_share_a_nodes_ram_a_gpu_each_and_unknown_memory_is_not_judged(size):
    facts = {"cpu": NodeFacts(cpus=4, mem_available_gb=120.0), "gpu": NodeFacts(gpus=2, gpu_memory_gb=24.0),
             "unknown": NodeFacts()}
    shares = memory.shares([("cpu", 4), ("gpu", 2), ("unknown", 1)], facts)
    assert [(s.node, s.gib) for s in shares] == [("cpu", 30.0), ("gpu", 24.0)]
    assert shares[0].what == "120.0 GiB RAM available for 4 ranks" and shares[1].what == "24.0 GiB GPU memory"
    line = memory.verdict(size, 7, shares)
    assert line.startswith("cpu: model hrm-50m at training.batch_size=64 needs about 42.67 GiB a rank") and \
        "cpu has 120.0 GiB RAM available for 4 ranks" in line, line
    assert memory.verdict(size, 7, shares[1:]).startswith("gpu: ")


def test_the_global_batch_is_kept_by_grad_accum_alone_when_the_user_gave_it():
    size = hrm_50m(global_batch_size=256)  # over 2 ranks: 128 a rank
    assert memory.rank_batch(size, 2) == 128
    line = memory.verdict(size, 2, memory.shares([("a", 1), ("b", 1)], {"a": NodeFacts(mem_available_gb=22.0),
                                                                       "b": NodeFacts(mem_available_gb=22.0)}))
    assert "at training.batch_size=128 " in line and "fix: training.grad_accum=8 (the same 256 rows a step" in line, line


def test_batch_auto_is_left_to_the_ranks_and_a_model_with_no_room_for_a_row_says_so(size):
    auto = dict(size, batch_size="auto", activation_bytes=0)
    assert memory.verdict(auto, 1, memory.shares([("n", 1)], {"n": NodeFacts(mem_available_gb=22.0)})) is None
    line = memory.verdict(auto, 1, memory.shares([("n", 1)], {"n": NodeFacts(mem_available_gb=0.5)}))
    assert line.startswith("n: model hrm-50m needs about 0.79 GiB a rank") and "not even one row fits" in line, line
    assert "training.parallel=fsdp" in line
    # under FSDP the states are shared by the world: the same memory holds them
    assert memory.verdict(auto, 4, memory.shares([("n", 1)], {"n": NodeFacts(mem_available_gb=0.5)}), fsdp=True) is None


TRAINER_OPTS = LaunchOptions(nodes=[], args=["model=50m", "task=lm"])


def test_the_refusal_is_exit_1_and_HRMCTL_MEMORY_CHECK_0_only_warns(size, monkeypatch):
    shares = memory.shares([("n", 1)], {"n": NodeFacts(mem_available_gb=22.0)})
    said = []
    with pytest.raises(HrmctlError) as exc:
        memory.check(TRAINER_OPTS, size, None, 1, shares, said.append)
    assert exc.value.exit_code == 1 and "HRMCTL_MEMORY_CHECK=0 launches anyway" in str(exc.value)
    monkeypatch.setenv("HRMCTL_MEMORY_CHECK", "0")
    assert memory.check(TRAINER_OPTS, size, None, 1, shares, said.append) == size
    assert len(said) == 1 and said[0].startswith("warning: n: model hrm-50m") and said[0].endswith(
        "(launching anyway: HRMCTL_MEMORY_CHECK=0)")
    assert memory.check(TRAINER_OPTS, None, None, 1, shares, said.append) is None  # not the trainer: nothing to judge


@pytest.mark.slow  # seconds of real work (a training, hrmctl train, a compile): not in --fast (issue 35, item 6)
def test_a_refusal_is_judged_again_at_the_datas_vocabulary(size):
    """The estimate beside the probes assumes 32000 tokens; the data's meta.json says 512: at batch 64 the logits
    alone were 2 x 1024 x 32000 x 4 bytes a row. model=50m task=lm at 64 rows needs 42.67 GiB at 32000, less at 512."""
    assert size["vocab"] == 32000
    at_512 = memory.model_size(TRAINER_OPTS, 1, 512)
    assert at_512["vocab"] == 512 and at_512["activation_bytes_per_row"] < size["activation_bytes_per_row"]
    room = (at_512["states_bytes"] + 64 * at_512["activation_bytes_per_row"]) / GIB + 0.5  # fits at 512, not 32000
    shares = memory.shares([("n", 1)], {"n": NodeFacts(mem_available_gb=room)})
    assert memory.verdict(size, 1, shares) is not None
    assert memory.check(TRAINER_OPTS, size, 512, 1, shares, print) == at_512


def test_an_estimate_is_reused_across_overrides_it_does_not_read_and_made_again_for_those_it_does():
    """The cache of estimates is keyed by what auralm.planning.sizing reads (its ``inputs``), not by the whole
    command line: a first launch with another max_steps or data_dir skipped a 4-6 s estimate (bench/slurm.py)."""
    def key(args, world, vocab):  # the trainer's reading of the overrides, as the launch gives it (None: refused)
        return memory._sizing_key(LaunchOptions(nodes=[], args=args).trainer, world, vocab)

    base = key(["model=tiny", "training.batch_size=8"], 2, None)
    assert base is not None
    assert key(["model=tiny", "training.batch_size=8", "training.max_steps=7", "data_dir=/elsewhere",
                "training.log_interval=1", "training.lr=1e-3"], 2, None) == base
    for args, world, vocab in ((["model=tiny", "training.batch_size=16"], 2, None),
                               (["model=small", "training.batch_size=8"], 2, None),
                               (["model=tiny", "training.batch_size=8", "training.ema=true"], 2, None),
                               (["model=tiny", "training.batch_size=8", "training.sync=diloco"], 2, None),
                               (["model=tiny", "training.batch_size=8", "model.n_layer=3"], 2, None),
                               (["model=tiny", "training.batch_size=8"], 1, None),
                               (["model=tiny", "training.batch_size=8"], 2, 512)):
        other = key(args, world, vocab)
        assert other is not None and other != base, args
    assert key(["model=no-such-model"], 1, None) is None  # the estimate's own process says what is wrong


def test_the_cache_of_estimates_keeps_its_newest_entries(tmp_path):
    """memory.model_size trims its cache to the last 100 entries inserted: the cache file keeps their order (written
    sorted by key, a new estimate could be the one trimmed away at the next launch, and be made again each time)."""
    from cli import cache

    path = tmp_path / "sizes.json"
    entries = {f"{k:02d}": k for k in range(100, 0, -1)}  # inserted newest last, keys in the opposite order
    assert cache.save(path, entries)
    kept = dict(list(cache.load(path).items())[-10:])
    assert list(kept.values()) == list(range(10, 0, -1))


def test_every_named_size_is_built_on_meta_without_torchs_python_reference_kernels():
    """auralm.models.registry.on_meta: the size estimate builds each model with shapes only. An op that runs torch's
    Python reference kernel on a meta tensor (an initialiser's fill, torch.randn / eye under torch.device's mode,
    arithmetic such as 2.0 * meta) imports torch._dynamo on its first use: about 1 s of each launch's estimate.
    Every named size of every built-in family is built here in one process, which must not have imported it."""
    code = (
        "import sys\n"
        "from auralm.errors import UserError\n"
        "from auralm.models import registry\n"
        "from auralm.planning.sizing import meta_model\n"
        "from auralm.training.command_line import parse_command_line\n"
        "from auralm.training.config import SIZES, resolved_model\n"
        "built = 0\n"
        "for name in SIZES:\n"
        "    for task in sorted(registry.size_tasks(name)):\n"
        "        try:\n"
        "            cfg = parse_command_line([f'model={name}', f'task={task}'])[0]\n"
        "        except UserError:  # a pair the config refuses (trm-5m-mlp's MLP mixer on text)\n"
        "            continue\n"
        "        model = meta_model(cfg.task, resolved_model(cfg.model), 512)\n"
        "        assert all(p.is_meta for p in model.parameters()), (name, task)\n"
        "        assert 'torch._dynamo' not in sys.modules, (name, task)\n"
        "        built += 1\n"
        "print(built)\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    assert int(res.stdout.split()[-1]) >= 20

def test_a_cache_file_that_is_a_link_is_written_through_it(tmp_path):
    """The test session's estimates are one file for every test process (tests/conftest.py own_cache links each
    session's to it): a save replaces the file the link names, and the link stays a link."""
    from cli import cache

    shared, link = tmp_path / "shared.json", tmp_path / "session" / "sizes.json"
    link.parent.mkdir()
    link.symlink_to(shared)
    assert cache.save(link, {"a": 1}) and link.is_symlink()
    assert cache.save(link, {**cache.load(link), "b": 2}) and link.is_symlink()
    assert cache.load(shared) == {"a": 1, "b": 2}
