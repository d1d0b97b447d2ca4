"""Metrics beside metrics.jsonl (issue #18): TensorBoard event files, a W&B run, the one-line error when the package
asked for is missing, the progress bar on a terminal only, and the memory figures."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import select
import struct
import subprocess
import termios
import time

import pytest
import torch

from auralm.training import command_line, tracking, train
from auralm.errors import UserError
from tests.trainer.helpers import PYTHON, python_env, records, tiny_args


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def sudoku_dir(sudoku_data):
    return sudoku_data(400)


def trm_args(data_dir, out_dir, *extra):
    """A TRM on sudoku, small: its records have the ACT metrics (lm_loss, ponder, ...) and, at the evaluations,
    val_loss, exact_accuracy and cell_acc."""
    return tiny_args(data_dir, out_dir, "model=trm-tiny", "arch.hidden_size=32", "arch.num_heads=2",
                     "training.batch_size=8", "training.max_steps=4", "training.eval_interval=2",
                     "training.eval_batches=1", "training.dtype=fp32", *extra)


# the names the tools' users know, for the records of trm_args' run
EXPECTED = {"train/loss", "train/lm_loss", "train/lr", "grad_norm", "train/samples_per_s", "train/ponder",
            "train/exact_accuracy", "train/q_halt_loss", "eval/loss", "eval/exact_accuracy", "eval/cell_accuracy",
            "memory/rss_gb"}


def test_record_keys_become_the_names_users_know():
    record = {"step": 7, "train_s": 1.5, "loss": 2.0, "lr": 1e-3, "tokens_per_s": 900.0, "rss_gb": 0.5,
              "grad_norm": 0.7, "lm_loss": 1.9, "ponder": 2.5, "train_exact_accuracy": 0.1, "halted_by_rank": [3, 4],
              "mhc/amax_pre": 1.2, "mhc/amax_post": 1.1, "val_loss": 2.1, "token_acc": 0.3, "cuda_allocated_gb": 1.0,
              "cuda_reserved_gb": 2.0, "something_new": 5}
    assert tracking.scalars(record) == {
        "train/seconds": 1.5, "train/loss": 2.0, "train/lr": 1e-3, "train/tokens_per_s": 900.0, "memory/rss_gb": 0.5,
        "grad_norm": 0.7, "train/lm_loss": 1.9, "train/ponder": 2.5, "train/exact_accuracy": 0.1,
        "mhc/amax_pre": 1.2, "mhc/amax_post": 1.1, "eval/loss": 2.1, "eval/token_accuracy": 0.3,
        "memory/cuda_allocated_gb": 1.0, "memory/cuda_reserved_gb": 2.0, "train/something_new": 5.0}
    # a non-finite loss is None in the record: left out, as are lists and texts
    assert tracking.scalars({"step": 1, "loss": None, "sample": "text"}) == {}


def test_the_logging_keys_and_their_checks():
    cfg = command_line.parse(["logging.tensorboard=true", "logging.wandb.project=p", "logging.wandb.entity=me",
                        "logging.wandb.mode=offline"])
    assert (cfg.logging.tensorboard, cfg.logging.wandb.project, cfg.logging.wandb.entity,
            cfg.logging.wandb.mode) == (True, "p", "me", "offline")
    assert tracking.plan(command_line.parse([]).logging).empty
    with pytest.raises(UserError, match=r"^logging.wandb.mode='sometimes': expected one of auto, online, offline$"):
        tracking.plan(command_line.parse(["logging.wandb.project=p", "logging.wandb.mode=sometimes"]).logging)
    with pytest.raises(UserError, match="logging.wandb.entity is set but logging.wandb.project is not"):
        tracking.plan(command_line.parse(["logging.wandb.entity=me"]).logging)


def test_wandb_auto_mode_is_offline_without_a_connection_or_a_key(monkeypatch):
    real_reachable = tracking.reachable
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.delenv("WANDB_BASE_URL", raising=False)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("NETRC", "/nonexistent/netrc")
    monkeypatch.setattr(tracking, "reachable", lambda host, port, timeout=1.0: False)
    assert tracking.wandb_mode("auto") == ("offline", "no connection to api.wandb.ai:443 within 1 s")
    monkeypatch.setattr(tracking, "reachable", lambda host, port, timeout=1.0: True)
    assert tracking.wandb_mode("auto")[0] == "offline"  # reachable, but no API key
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    assert tracking.wandb_mode("auto") == ("online", "api.wandb.ai answers")
    monkeypatch.setenv("WANDB_MODE", "offline")
    assert tracking.wandb_mode("auto") == ("offline", "WANDB_MODE=offline")
    assert tracking.wandb_mode("online") == ("online", "logging.wandb.mode=online")
    # the real check: a port nobody listens on does not answer (refused at once; the check's own limit is 1 s, and
    # 3 s leaves room for a loaded machine three times slower)
    began = time.monotonic()
    assert not real_reachable("127.0.0.1", 9)
    assert time.monotonic() - began < 3


@pytest.mark.slow
def test_tensorboard_event_files_hold_what_metrics_jsonl_holds(sudoku_dir, tmp_path, capsys):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    assert train.main(trm_args(sudoku_dir, tmp_path, "logging.tensorboard=true")) == 0
    acc = EventAccumulator(str(tmp_path / "tensorboard"), size_guidance={"scalars": 0})
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert EXPECTED <= tags, EXPECTED - tags
    logged = {tag: {e.step: e.value for e in acc.Scalars(tag)} for tag in tags}
    recs = records(tmp_path)
    assert [r["step"] for r in recs] == [1, 2, 3, 4]
    for r in recs:
        for name, value in tracking.scalars(r).items():  # TensorBoard keeps float32
            assert logged[name][r["step"]] == struct.unpack("f", struct.pack("f", value))[0], (name, r["step"])
    assert set(logged["eval/loss"]) == {2, 4}
    assert sum(len(v) for v in logged.values()) == sum(len(tracking.scalars(r)) for r in recs)


def wandb_offline_records(path):
    """The records of a W&B run's transaction log (``run-<id>.wandb``): an offline run of wandb 0.31 (wandb-core)
    writes its history and summary only there (no files/wandb-summary.json until it is synced). The format is
    wandb's LevelDB-style log: a 7-byte header (":W&B", magic 0xBEE1, version), then 32 KiB blocks of chunks,
    each with a 7-byte header (crc32, length, type: 1 full, 2 first, 3 middle, 4 last) holding a protobuf Record."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    ident, magic, _ = struct.unpack("<4sHB", data[:7])
    assert (ident, magic) == (b":W&B", 0xBEE1)
    pos, chunk = 7, b""
    while pos + 7 <= len(data):
        left = 32768 - pos % 32768
        if left < 7:  # a block's tail too short for a chunk header is padding
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if (length, kind) == (0, 0):
            break
        chunk += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(chunk)
            chunk = b""
            yield record


def _key(item) -> str:
    return item.key or "/".join(item.nested_key)


@pytest.mark.slow
def test_wandb_offline_writes_a_run_with_the_metrics(sudoku_dir, tmp_path, monkeypatch, capsys):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wb"))
    run = tmp_path / "run"
    assert train.main(trm_args(sudoku_dir, run, "logging.wandb.project=hrmctl-test")) == 0
    out = capsys.readouterr().out
    [wandb_dir] = (tmp_path / "wb" / "wandb").glob("offline-run-*")
    assert f"W&B: offline (WANDB_MODE=offline); `wandb sync {wandb_dir}` uploads it later" in out.splitlines()
    run_id = (run / "wandb-run-id").read_text().strip()
    assert wandb_dir.name.endswith("-" + run_id)
    history, summary, config_items = {}, {}, {}
    for r in wandb_offline_records(wandb_dir / f"run-{run_id}.wandb"):
        kind = r.WhichOneof("record_type")
        if kind == "history":
            history[r.history.step.num] = {_key(i): json.loads(i.value_json) for i in r.history.item}
        elif kind == "summary":
            summary.update({_key(i): json.loads(i.value_json) for i in r.summary.update})
        elif kind == "run":
            config_items.update({_key(i): json.loads(i.value_json) for i in r.run.config.update})
    recs = records(run)
    assert sorted(history) == [r["step"] for r in recs] == [1, 2, 3, 4]
    for r in recs:  # every step: the same names and values as metrics.jsonl
        logged = {k: v for k, v in history[r["step"]].items() if not k.startswith("_")}
        assert logged == tracking.scalars(r), r["step"]
    assert EXPECTED <= set(summary), EXPECTED - set(summary)
    assert summary["_step"] == 4
    for name, value in tracking.scalars(recs[-1]).items():
        assert summary[name] == value, name
    assert config_items["model"]["name"] == "trm-tiny"  # the resolved config went with it




@pytest.mark.slow
def test_a_resumed_run_continues_its_tensorboard_steps_and_its_wandb_run(sudoku_dir, tmp_path, monkeypatch):
    pytest.importorskip("tensorboard")
    pytest.importorskip("wandb")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.delenv("WANDB_DIR", raising=False)
    run = tmp_path / "run"
    both = ["logging.tensorboard=true", "logging.wandb.project=hrmctl-test", "training.checkpoint_interval=2"]
    assert train.main(tiny_args(sudoku_dir, run, "training.max_steps=4", *both)) == 0
    run_id = (run / "wandb-run-id").read_text()
    # from step 2: steps 3 and 4 again, then 5 and 6
    assert train.main(tiny_args(sudoku_dir, run, "training.max_steps=6", f"resume={run / 'checkpoint-2'}", *both)) == 0
    acc = EventAccumulator(str(run / "tensorboard"), size_guidance={"scalars": 0})
    acc.Reload()
    losses = [(e.step, e.value) for e in acc.Scalars("train/loss")]
    second = {r["step"]: r["loss"] for r in records(run)[4:]}  # the resumed attempt's records, steps 3 to 6
    assert [s for s, _ in losses] == [1, 2, 3, 4, 5, 6]  # the first attempt's 3 and 4 are hidden (purge_step)
    assert all(v == struct.unpack("f", struct.pack("f", second[s]))[0] for s, v in losses if s > 2)
    assert (run / "wandb-run-id").read_text() == run_id  # the same W&B run, continued
    runs = list((run / "wandb").glob("offline-run-*"))  # offline-run-<time>-<id>, "-1" added when <time> repeats
    assert len(runs) == 2 and all(f"-{run_id.strip()}" in p.name for p in runs), runs


BLOCK = """import sys
# The package is installed in this venv; this run behaves as if it were not: None in sys.modules makes
# `import {pkgs}` raise ImportError (ModuleNotFoundError) exactly like a missing package does.
for name in {names!r}:
    sys.modules[name] = None
from auralm.training.train import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize("blocked, args, line", [
    (["tensorboard"], ["logging.tensorboard=true"],
     "error: logging.tensorboard=true needs the tensorboard package, not installed here: pip install tensorboard"),
    (["wandb"], ["logging.wandb.project=p"],
     "error: logging.wandb.project needs the wandb package, not installed here: pip install wandb"),
    (["tensorboard", "wandb"], ["logging.tensorboard=true", "logging.wandb.project=p"],
     "error: logging.tensorboard=true and logging.wandb.project need the tensorboard and wandb packages, not "
     "installed here: pip install tensorboard wandb"),
])
def test_a_missing_package_is_one_line_and_exit_2_before_anything_runs(tmp_path, blocked, args, line):
    run = tmp_path / "run"
    p = subprocess.run([PYTHON, "-c", BLOCK.format(pkgs=", ".join(blocked), names=blocked),
                        *tiny_args(tmp_path / "no-data", run, "training.max_steps=2", *args)],
                       capture_output=True, text=True, env=python_env(), cwd=tmp_path, timeout=120)
    assert (p.returncode, p.stderr, p.stdout) == (2, line + "\n", "")
    assert not run.exists()  # nothing was trained or written


def on_a_terminal(args: list[str], cwd, timeout: float = 120) -> tuple[int, str]:
    """The trainer with its stdout and stderr on a pseudo-terminal of 120 columns: (exit code, what it showed)."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    env = python_env(TERM="xterm-256color")
    for k in ("NO_COLOR", "TTY_INTERACTIVE", "TTY_COMPATIBLE", "COLUMNS", "LINES"):
        env.pop(k, None)
    p = subprocess.Popen([PYTHON, "-m", "auralm.training.train", *args], stdin=slave, stdout=slave, stderr=slave, env=env,
                         cwd=cwd)
    os.close(slave)
    chunks, deadline = [], time.monotonic() + timeout
    while time.monotonic() < deadline:
        if select.select([master], [], [], 1.0)[0]:
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: the trainer closed the terminal
                break
            if not data:
                break
            chunks.append(data)
        elif p.poll() is not None:
            break
    os.close(master)
    return p.wait(timeout=10), b"".join(chunks).decode("utf-8", "replace")


STEP_LINE = r"^step \d+/30 \| loss \d+\.\d{4} \| lr \S+ \| \d+ puzzles/s \| rss \d+\.\dG \| eta \S+$"


@pytest.mark.slow
def test_the_progress_bar_shows_on_a_terminal_and_plain_lines_otherwise(sudoku_dir, tmp_path):
    def args(out):
        return tiny_args(sudoku_dir, tmp_path / out, "training.max_steps=30", "training.log_interval=10")

    code, shown = on_a_terminal(args("tty"), tmp_path)
    assert code == 0, shown
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", shown).replace("\r", "\n")  # the terminal's control sequences
    lines = [l.rstrip() for l in text.splitlines()]
    assert re.search(r"^step 30/30 ━+ 100% \d+:\d\d:\d\d ETA \d+:\d\d:\d\d loss \d+\.\d{4} *$", text, re.M), text
    steps = [l for l in lines if l.startswith("step ") and "|" in l]  # the lines, above the bar
    assert [l.split(" |")[0] for l in steps] == ["step 10/30", "step 20/30", "step 30/30"], text
    assert all(re.match(STEP_LINE, l) for l in steps), steps

    # not a terminal (a pipe, as under hrmctl and in tests): the lines as before, nothing else
    p = subprocess.run([PYTHON, "-m", "auralm.training.train", *args("pipe")], capture_output=True, text=True,
                       env=python_env(TERM="xterm-256color"), cwd=tmp_path, timeout=120)
    assert p.returncode == 0, p.stderr
    assert "━" not in p.stdout and "\x1b" not in p.stdout and "ETA" not in p.stdout
    steps = [l for l in p.stdout.splitlines() if l.startswith("step ")]
    assert [l.split(" |")[0] for l in steps] == ["step 10/30", "step 20/30", "step 30/30"]
    assert all(re.match(STEP_LINE, l) for l in steps), steps


def test_memory_figures_on_cpu_and_on_cuda(monkeypatch):
    assert list(train.memory_record(torch.device("cpu"))) == ["rss_gb"]
    assert re.fullmatch(r"rss \d+\.\dG", train.memory_text(train.memory_record(torch.device("cpu"))))
    # no GPU here: the CUDA allocator's three figures are stand-ins, the code around them is the trainer's
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: 1.5e9)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: 1.1e9)
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: 2.0e9)
    mem = train.memory_record(torch.device("cuda", 0))
    assert mem == {"cuda_peak_gb": 1.5, "cuda_allocated_gb": 1.1, "cuda_reserved_gb": 2.0}
    assert train.memory_text(mem) == "cuda peak 1.5G alloc 1.1G reserved 2.0G"
    assert tracking.scalars(mem) == {"memory/cuda_peak_gb": 1.5, "memory/cuda_allocated_gb": 1.1,
                                     "memory/cuda_reserved_gb": 2.0}
