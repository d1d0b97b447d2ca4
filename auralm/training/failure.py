"""A run's failure as one line, whatever raised it: the one place that tells a write that failed for want of room or
rights, and a peer gone, from anything else.

The libraries that write a checkpoint raise their own types, and some hide the errno: safetensors' SafetensorError
says ``No space left on device (os error 28)``; torch.save's RuntimeError says ``unexpected pos 576 vs 534`` (its
context: ``basic_ios::clear: iostream error``) or ``File ... cannot be opened``; pickle and zipfile raise OSError.
:func:`write_errno` walks the exception's chain (``__cause__``, ``__context__``) for an OSError's errno, then reads
the messages (an ``os error N``, a ``strerror`` of the errnos below), and where a library said only that a write
failed, looks at the file system it was writing to (read-only, full, not writable), before the partial checkpoint
is removed (auralm.training.checkpoint). :func:`line` is the trainer's one line for it: what could not be written and
why, that the partial checkpoint is gone, and the last whole checkpoint that ``resume=latest`` goes on from.
"""

from __future__ import annotations

import errno
import os
import re
from pathlib import Path

# a write that failed for want of room or rights: what to do about it
WRITE_ERRNOS = {
    errno.ENOSPC: "free space there, or give out_dir= a disk with room",
    errno.EDQUOT: "free space within your quota there, or give out_dir= a disk with room",
    errno.EFBIG: "the file system takes no file that large: give out_dir= another disk",
    errno.EROFS: "make it writable (remount it read-write), or give out_dir= another directory",
    errno.EACCES: "fix its permissions (chown/chmod), or give out_dir= another directory",
    errno.EPERM: "fix its permissions (chown/chmod), or give out_dir= another directory",
}
_OS_ERROR = re.compile(r"\(os error (\d+)\)")  # Rust's io::Error, as safetensors words it
# "No space left on device" inside a library's message (not EPERM's "Operation not permitted": CUDA says it too)
_STRERRORS = {os.strerror(n): n for n in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EACCES)}
# a write failed, its errno hidden: torch.save's zip writer (PyTorchFileWriter), its open, safetensors' serializer
_HIDDEN = ("unexpected pos", "iostream error", "PytorchStreamWriter failed", "file write failed", "cannot be opened",
           "Error while serializing")
# a peer gone: gloo's and NCCL's words, and the socket's
_PEER_GONE = ("Connection closed by peer", "Connection reset by peer", "Broken pipe", "Connection refused",
              "NCCL communicator was aborted", "Socket Timeout", "Timed out waiting", "recvBytes", "sendBytes",
              "ProcessGroupGloo", "DistNetworkError", "DistBackendError")
MIN_FREE = 1 << 20  # a file system with less than this free is full, for a write that failed without an errno


class WriteFailed(Exception):
    """A checkpoint (or another file of the run) that could not be written: ``path``, the errno (None: the library
    did not say, nor did the file system), and the run directory whose last whole checkpoint a rerun resumes."""

    def __init__(self, path: Path, code: int | None, run_dir: Path | None, free: str = ""):
        super().__init__(f"cannot write {path}: {os.strerror(code).lower() if code else 'failed'}")
        self.path, self.errno, self.run_dir, self.free = path, code, run_dir, free  # free: as it was on failing


def chain(e: BaseException):
    """``e`` and what it was raised from or during, once each."""
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        yield e
        e = e.__cause__ or e.__context__


def write_errno(e: BaseException, where: Path | None = None) -> int | None:
    """The errno of a write that failed for want of room or rights, from ``e``'s chain or its messages; where a
    library hid it, what the file system at ``where`` says (see :func:`probe`). None: not such a failure."""
    for x in chain(e):
        if isinstance(x, OSError) and x.errno in WRITE_ERRNOS:
            return x.errno
    for x in chain(e):
        text = str(x)
        found = [int(n) for n in _OS_ERROR.findall(text) if int(n) in WRITE_ERRNOS]
        found += [n for s, n in _STRERRORS.items() if s in text]
        if found:
            return found[0]
    if where is not None and any(h in str(x) for x in chain(e) for h in _HIDDEN):
        return probe(where)
    return None


def probe(where: Path) -> int | None:
    """What the file system holding ``where`` (or its nearest existing parent) says against a write: EROFS when
    mounted read-only, ENOSPC when (nearly) full, EACCES when not writable by this process; None when none of them."""
    path, st = _statvfs(where)
    if st is None:
        return None
    if st.f_flag & os.ST_RDONLY:
        return errno.EROFS
    if st.f_bavail * st.f_frsize < MIN_FREE:
        return errno.ENOSPC
    if not os.access(path, os.W_OK):
        return errno.EACCES
    return None


def wrap_write(e: BaseException, path: Path, run_dir: Path) -> WriteFailed | None:
    """``e``, raised while writing ``path`` of ``run_dir``, as a WriteFailed when it was room or rights (looked at
    now, before the partial file is removed); None for anything else (a bug: its traceback is worth keeping)."""
    code = write_errno(e, path)
    if code is None:
        return None
    return WriteFailed(path, code, run_dir, free_text(run_dir) if code in (errno.ENOSPC, errno.EDQUOT) else "")


def free_text(where: Path) -> str:
    """``12.0 MB free`` on the file system of ``where``, or "" when it cannot be told."""
    _, st = _statvfs(where)
    return "" if st is None else f"{st.f_bavail * st.f_frsize / 1e6:.1f} MB free"


def _statvfs(where: Path) -> tuple[Path, os.statvfs_result | None]:
    """The nearest existing path at or above ``where``, and its file system's figures (None: cannot be told)."""
    path = Path(where)
    while not path.exists() and path != path.parent:
        path = path.parent
    try:
        return path, os.statvfs(path)
    except OSError:
        return path, None


def checkpoint_dirs(run_dir: Path) -> list[Path]:
    from auralm.training import checkpoint

    return checkpoint.list_checkpoints(run_dir)


def last_whole(run_dir: Path | None) -> Path | None:
    """The newest checkpoint of ``run_dir`` that is whole (its checksums match), or None."""
    if run_dir is None:
        return None
    from auralm.training import checkpoint

    return next((c for c in checkpoint_dirs(Path(run_dir)) if checkpoint.problem(c) is None), None)


def write_line(rank: int, e: BaseException, run_dir: Path | None) -> str | None:
    """The one line for a run that could not write (``e``: a WriteFailed, or anything whose chain holds a write's
    errno): what, why, what to do, and where ``resume=latest`` goes on from. None: not a failed write."""
    failed = next((x for x in chain(e) if isinstance(x, WriteFailed)), None)
    if failed is not None:
        path, code, run_dir, free = failed.path, failed.errno, failed.run_dir or run_dir, failed.free
        partial = "; the partial checkpoint is removed"
    else:
        code = write_errno(e)
        if code is None:
            return None
        name = next((x.filename for x in chain(e) if isinstance(x, OSError) and x.filename), None)
        path, partial = Path(name) if name else (run_dir or Path("a file")), ""
        if run_dir is None and name and checkpoint_dirs(Path(name).parent):
            run_dir = Path(name).parent  # metrics.jsonl beside the run's checkpoints
        free = free_text(Path(path).parent) if code in (errno.ENOSPC, errno.EDQUOT) else ""
    where = Path(run_dir) if run_dir is not None else Path(path).parent
    whole = last_whole(run_dir)
    then = (f"then rerun with out_dir={run_dir} resume=latest: it goes on from {whole} (step "
            f"{whole.name.rpartition('-')[2]})" if whole is not None else
            "then rerun (no whole checkpoint yet: it starts again from step 0)")
    return (f"error: rank {rank}: cannot write {path}: {os.strerror(code).lower()}"
            f"{f' ({where}: {free})' if free else ''}{partial}; {WRITE_ERRNOS[code]}; {then}")


def peer_gone(e: BaseException) -> bool:
    """Whether ``e`` is a collective that failed because a peer is gone (or hung): gloo's, NCCL's, the socket's."""
    return any(word in str(x) or word in type(x).__name__ for x in chain(e) for word in _PEER_GONE)


def peer_line(rank: int, e: BaseException) -> str:
    """A peer gone, in one line: the rank that failed first says why (hrmctl's last line is its)."""
    first = (str(e).strip().splitlines() or [type(e).__name__])[0]
    first = re.sub(r"^\[[^\]]*\.(?:cc|cpp|h):\d+\]\s*", "", first)  # gloo's source file and line
    first = first.split(". ", 1)[0]  # gloo's advice after it ("This is typically caused by ...")
    return f"error: rank {rank}: a peer is gone ({first}); the rank that failed first says why"
