"""Small files for `hrmctl sync-data`, streamed through the node agent instead of SFTP.

Over SFTP every file costs an open, a write and a close (three requests and replies handled in
Python on our side), then the node reads it back to hash it. Here files up to STREAM_MAX go in
batches on the agent's stdin: a job line `{"op": "put", "files": [[rel, size, mtime_ns, mode,
sha256], ...]}` and then their bytes, back to back. The node (node/sync_receiver.py `put`) writes
each one to `.NAME.hrmctl-part`, hashing the bytes as it writes them, and renames it over the
final name only if the hash is the source's. Two batches are in flight, so the node writes one
while the next is on its way. Larger files keep going over SFTP, where a cut transfer resumes.
"""

from __future__ import annotations

import hashlib
from typing import Callable, Iterable, Iterator

from cli.sync.plan import SyncError, Transfer
from node.sync_receiver import read_small
from cli.sync.send import Finalizer, NodeAgent, Sender

STREAM_MAX = 256 * 1024         # files up to this size are streamed; bigger ones go over SFTP
BATCH_BYTES = 2 << 20           # a batch ends after this many bytes or BATCH_FILES files
BATCH_FILES = 1000


def streamable(t: Transfer) -> bool:
    return t.file.size <= STREAM_MAX


def stream_files(agent: NodeAgent, root: str, todo: Iterable[Transfer], sender: Sender, finalizer: Finalizer,
                 on_bytes: Callable[[int], None]) -> None:
    """Send todo through the agent. Results go where SFTP's go: verified files to finalizer.done,
    mismatches to finalizer.bad (sent again by the caller), a failed write to sender's failures.
    `todo` may be shared with other agents (a SharedFiles): each takes files as it makes batches."""
    by_rel: dict[str, Transfer] = {}
    sizes: list[int] = []           # payload bytes of each batch in flight, oldest first
    refused: list[str] = []

    def batches() -> Iterator[tuple[dict, bytes]]:
        files: list[list] = []
        chunks: list[bytes] = []
        size = 0
        for t in todo:
            if sender.stopped:
                return
            f = t.file
            data = read_small(f.path, f.size)       # + 1 byte: a file that grew since the scan is seen
            if len(data) != f.size:
                finalizer.bad.append((t, f"its size changed while it was read ({f.size} -> {len(data)})"))
                continue
            by_rel[f.rel] = t
            files.append([f.rel, f.size, f.mtime_ns, f.mode, hashlib.sha256(data).hexdigest()])
            chunks.append(data)
            size += f.size
            if size >= BATCH_BYTES or len(files) >= BATCH_FILES:
                sizes.append(size)
                yield {"op": "put", "dest": root, "files": files}, b"".join(chunks)
                files, chunks, size = [], [], 0
        if files:
            sizes.append(size)
            yield {"op": "put", "dest": root, "files": files}, b"".join(chunks)

    def answered(answer: dict) -> bool:
        on_bytes(sizes.pop(0))
        finalizer.done.extend(answer["done"])
        finalizer.bad.extend((by_rel[rel], why) for rel, why in answer["bad"])
        if answer.get("refused"):
            refused.append(answer["refused"])
            return False
        if answer.get("failed"):
            rel, why, code = answer["failed"]
            sender.fail(by_rel[rel], why, code)
            return False
        return not sender.stopped

    agent.call_many(batches(), answered)
    if refused:
        raise SyncError(f"{agent.name}: {refused[0]}")
