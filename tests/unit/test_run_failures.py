"""Issue 63, item 5: every failure of a run is one line, whatever raised it. A full or read-only disk is made for
real (a small tmpfs, mounted as root; a read-only directory otherwise), the libraries that write checkpoints write
into it (safetensors, torch.save, pickle), and the trainer's one place that reads their errors
(auralm/training/failure.py) tells the errno; a real tiny training into a tiny checkpoint directory ends in one line
naming the last whole checkpoint, with the partial one removed, and resume=latest goes on from it."""

from __future__ import annotations

import contextlib
import errno
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
import safetensors.torch
import torch

from auralm.training import checkpoint, failure

ROOT = os.geteuid() == 0
NOT_ROOT = "mounting a tmpfs (a real full or read-only disk) needs root"


@contextlib.contextmanager
def tmpfs(path: Path, size: str = "1m"):
    """A real file system of ``size`` at ``path``, unmounted at the end."""
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def fill(where: Path, leave: int = 0) -> Path:
    """All of ``where``'s file system but ``leave`` bytes taken by one file (fallocate: at once)."""
    st = os.statvfs(where)
    filler = where / "filler"
    subprocess.run(["fallocate", "-l", str(max(st.f_bavail * st.f_frsize - leave, 4096)), str(filler)], check=True)
    return filler


def writers(d: Path):
    """The ways a checkpoint's files are written, each into ``d``."""
    model = torch.nn.Linear(300, 300)
    return {"safetensors": lambda: safetensors.torch.save_model(model, str(d / "model.safetensors")),
            "torch.save": lambda: torch.save({"w": torch.randn(200_000)}, d / "optimizer.pt"),
            "pickle": lambda: pickle.dump(list(range(200_000)), open(d / "state.pkl", "wb"))}


def raised(write) -> BaseException:
    try:
        write()
    except Exception as e:  # what the library raises, as it raises it
        return e
    raise AssertionError("the write did not fail")


@pytest.mark.skipif(not ROOT, reason=NOT_ROOT)
@pytest.mark.parametrize("how", ["safetensors", "torch.save", "pickle"])
def test_a_full_disk_is_told_whatever_library_wrote(tmp_path, how):
    with tmpfs(tmp_path / "disk", "256k") as disk:
        fill(disk)
        e = raised(writers(disk)[how])
        assert failure.write_errno(e, disk) == errno.ENOSPC, repr(e)


@pytest.mark.skipif(not ROOT, reason=NOT_ROOT)
@pytest.mark.parametrize("how", ["safetensors", "torch.save", "pickle"])
def test_a_read_only_disk_is_told_whatever_library_wrote(tmp_path, how):
    with tmpfs(tmp_path / "disk") as disk:
        subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True)
        e = raised(writers(disk)[how])
        assert failure.write_errno(e, disk) == errno.EROFS, repr(e)


@pytest.mark.skipif(ROOT, reason="root writes into a read-only directory anyway (the tmpfs tests cover root)")
def test_a_read_only_directory_is_told(tmp_path):
    d = tmp_path / "ro"
    d.mkdir()
    d.chmod(0o555)
    try:
        for write in writers(d).values():
            assert failure.write_errno(raised(write), d) == errno.EACCES
    finally:
        d.chmod(0o755)


def test_a_library_that_hides_the_errno_is_read_by_its_words_and_anything_else_is_not_a_write():
    hidden = RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 576 vs 534")
    hidden.__context__ = RuntimeError("basic_ios::clear: iostream error")
    assert failure.write_errno(hidden) is None  # no errno, no path to look at
    wrapped = ValueError("checkpoint")
    wrapped.__cause__ = OSError(errno.EDQUOT, "Disk quota exceeded")
    assert failure.write_errno(wrapped) == errno.EDQUOT
    assert failure.write_errno(Exception("Error while serializing: I/O error: No space left on device (os error 28)")) \
        == errno.ENOSPC
    assert failure.write_errno(TypeError("unsupported operand")) is None
    assert failure.write_line(0, KeyError("x"), None) is None  # a bug keeps its traceback
    gone = RuntimeError("[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by "
                        "peer [127.0.0.1]:2266. This is typically caused by a remote worker crashing. GLHF!")
    assert failure.peer_gone(gone) and failure.peer_line(1, gone) == (
        "error: rank 1: a peer is gone (Connection closed by peer [127.0.0.1]:2266); the rank that failed first says why")
    assert not failure.peer_gone(RuntimeError("mat1 and mat2 shapes cannot be multiplied"))


def _save(run_dir: Path, step: int):
    model = torch.nn.Linear(64, 64)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(2, 64)).sum().backward()
    opt.step()
    return checkpoint.save(run_dir, step, model, opt, [], {"val_loss": None}, keep_last=3)


@pytest.mark.skipif(not ROOT, reason=NOT_ROOT)
def test_a_checkpoint_that_does_not_fit_is_removed_and_the_last_whole_one_named(tmp_path):
    with tmpfs(tmp_path / "disk", "2m") as disk:
        run = disk / "run"
        first = _save(run, 1)
        size = sum(f.stat().st_size for f in first.iterdir())
        filler = fill(disk, leave=size // 2)
        with pytest.raises(failure.WriteFailed) as e:
            _save(run, 2)
        assert e.value.errno == errno.ENOSPC and e.value.path == run / "checkpoint-2"
        assert sorted(p.name for p in run.iterdir()) == ["checkpoint-1"]  # no .checkpoint-2.tmp left
        line = failure.write_line(0, e.value, None)
        assert line.startswith(f"error: rank 0: cannot write {run}/checkpoint-2: no space left on device (")
        assert "the partial checkpoint is removed" in line and "\n" not in line
        assert line.endswith(f"then rerun with out_dir={run} resume=latest: it goes on from {first} (step 1)")
        filler.unlink()
        assert checkpoint.problem(_save(run, 2)) is None  # room again: the same step writes whole


def train(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "auralm.training.train", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=600, env=dict(os.environ, OMP_NUM_THREADS="1"))


@pytest.mark.slow  # three real tiny trainings
@pytest.mark.skipif(not ROOT, reason=NOT_ROOT)
def test_a_training_whose_disk_fills_ends_in_one_line_and_resumes_from_the_last_whole_checkpoint(tmp_path):
    from tests.trainer.helpers import small_sudoku, tiny_args

    data = small_sudoku(tmp_path / "sdk", count=120)
    with tmpfs(tmp_path / "disk", "16m") as disk:
        run = disk / "run"
        args = [*tiny_args(data, run), "training.checkpoint_interval=2", "training.log_interval=2"]
        first = train(*args, "training.max_steps=2", cwd=tmp_path)
        assert first.returncode == 0, first.stderr
        whole = run / "checkpoint-2"
        filler = fill(disk, leave=sum(f.stat().st_size for f in whole.iterdir()) // 2)  # half a checkpoint left
        full = train(*args, "training.max_steps=4", "resume=latest", cwd=tmp_path)
        assert full.returncode == 2, full.stderr
        errors = [line for line in full.stderr.splitlines() if line.startswith("error:")]
        assert errors == [line for line in full.stderr.splitlines() if line.strip()], full.stderr  # one line
        [line] = errors
        assert line.startswith(f"error: rank 0: cannot write {run}/checkpoint-4: no space left on device"), line
        assert line.endswith(f"resume=latest: it goes on from {whole} (step 2)"), line
        assert "Traceback" not in full.stdout + full.stderr
        assert not list(run.glob(".checkpoint-*")) and not (run / "checkpoint-4").exists()
        filler.unlink()
        again = train(*args, "training.max_steps=4", "resume=latest", cwd=tmp_path)
        assert again.returncode == 0, again.stderr
        assert f"resuming from {whole} (step 2)" in again.stdout
        assert checkpoint.problem(run / "checkpoint-4") is None


@pytest.mark.slow  # a real tiny training, then hrmctl train with torchrun and two ranks
@pytest.mark.skipif(not ROOT, reason=NOT_ROOT)
def test_under_hrmctl_the_run_ends_in_the_trainers_line_with_no_traceback_on_screen_or_in_the_files(
        tmp_path, monkeypatch, capfd):
    """The merged log of `hrmctl train --nproc 2` whose checkpoint does not fit: rank 0's one line is the run's last
    line, and no traceback of the trainer's or torchrun's is on the screen or in the node's file (what `hrmctl logs`
    merges). The preflight's own floor of free space (300 MB) is lowered here, in this process, so that the disk is
    full from the start of the launch instead of filling at some moment of it: no race with the training."""
    from cli import app
    from cli.launch.preflight import storage
    from tests.trainer.helpers import small_sudoku, tiny_args

    data = small_sudoku(tmp_path / "sdk", count=120)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HRMCTL_INVENTORY", str(tmp_path / "none.toml"))
    monkeypatch.setattr(storage, "MIN_FREE_MB", 0)
    with tmpfs(tmp_path / "disk", "16m") as disk:
        run = disk / "run"
        args = [*tiny_args(data, run), "training.checkpoint_interval=2", "training.log_interval=2",
                "training.batch_size=8"]
        assert train(*args, "training.max_steps=2", cwd=tmp_path).returncode == 0
        whole = run / "checkpoint-2"
        fill(disk, leave=sum(f.stat().st_size for f in whole.iterdir()) // 2)
        capfd.readouterr()
        code = app.main(["train", "--nproc", "2", "--run-id", "full", *args, "training.max_steps=4", "resume=latest"])
        out, err = capfd.readouterr()
        assert code == 1, out + err  # torchrun's, when a rank failed (docs/train.md: exit codes)
        last = err.strip().splitlines()[-1]
        assert last.startswith(f"error: rank 0: cannot write {run}/checkpoint-4: no space left on device"), err
        assert f"it goes on from {whole} (step 2) (rank 0 on localhost, after " in last, last
        kept = (tmp_path / "runs" / "full" / "localhost.log").read_text()
        assert "Traceback" not in out + err + kept, out + err + kept
        assert "failed first (exit code" not in out + err  # the launcher's line without the trainer's
        assert not list(run.glob(".checkpoint-*")) and not (run / "checkpoint-4").exists()
