"""The node side of `hrmctl sync-data`, run by the node's Python (`python -S -c ship.program("sync_receiver")`;
its client: cli/sync/send.py NodeAgent).

Standard library only, because it runs with the node's Python before anything of hrmctl may be
installed there. `serve()` answers JSON jobs, one per line on stdin, with one JSON line each on
stdout (node/lines.py), so one process serves a whole sync. Operations:

  scan      the destination's manifest: {relpath: [size, mtime_ns, sha256 or None]}, partly
            sent files (`.NAME.hrmctl-part`) with their size and SHA-256, free space; creates
            the destination unless it is a dry run.
  mkdirs    the source's directories that the node lacks (parents first).
  finalize  for each sent file: hash the part file, compare with the source's SHA-256, set
            mtime and mode, rename it over the final name; remove stale part files; --delete.
  put       small files whose bytes follow the job line on stdin (sizes in the job): each is
            written to its part file and hashed as it is written; only a part whose SHA-256
            equals the source's gets the source's mode and mtime and is renamed over the final
            name. Every byte of the batch is read even after a failure, so the next job line
            is where the other side expects it (serve() reads them with the job line).
  space     free bytes at the destination (to explain a failed write).

Every relative path that comes from the other side is checked here too: no absolute paths,
no `..`, and no directory on the way that resolves outside the destination (a symlink).
"""

import errno
import hashlib
import json
import os
import stat
import sys

from node.lines import encode, say, write

PART_SUFFIX = ".hrmctl-part"
HEARTBEAT_S = 2.0
BLOCK = 1 << 20
NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW


class Refused(Exception):
    pass


def part_name(rel):
    head, _, name = rel.rpartition("/")
    return (head + "/" if head else "") + "." + name + PART_SUFFIX


def final_of_part(rel):
    head, _, name = rel.rpartition("/")
    if not (name.startswith(".") and name.endswith(PART_SUFFIX)) or len(name) <= len(PART_SUFFIX) + 1:
        return None
    return (head + "/" if head else "") + name[1:-len(PART_SUFFIX)]


def check_rel(rel):
    if not isinstance(rel, str) or not rel or "\0" in rel or rel.startswith("/"):
        raise Refused("refusing path %r: not a relative path" % (rel,))
    parts = rel.split("/")
    if "" in parts or "." in parts or ".." in parts:
        raise Refused("refusing path %r: empty, '.' or '..' component" % (rel,))


def inside(root, rel, checked=None):
    """Absolute path of rel under root; refused if its directory resolves outside root.

    `checked` (a set) remembers directories already found inside, for long lists of files."""
    check_rel(rel)
    path = root.rstrip("/") + "/" + rel  # rel is checked: no "", "." or ".." in it
    directory = path.rpartition("/")[0] or "/"
    if checked is not None and directory in checked:
        return path
    parent = os.path.realpath(directory)
    if parent != root and not parent.startswith(root.rstrip("/") + "/"):
        raise Refused("refusing %s: its directory leads outside the destination %s (a symlink?)" % (rel, root))
    if checked is not None:
        checked.add(directory)
    return path


def read_small(path, size):
    """The bytes of a file of about `size` bytes (< BLOCK), and one more if it grew since its
    stat, so that a changed file does not pass. os.read, not open(): a third of the time for
    the thousands of small files of a dataset tree."""
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.read(fd, size + 1)
    finally:
        os.close(fd)


def sha256_file(path, limit=None, size=None):
    if size is not None and size < BLOCK:  # one read, no loop: most files of a dataset tree are small
        return hashlib.sha256(read_small(path, size)).hexdigest()
    h = hashlib.sha256()
    left = limit
    with open(path, "rb") as fh:
        while True:
            chunk = fh.read(BLOCK if left is None else min(BLOCK, left))
            if not chunk:
                break
            h.update(chunk)
            if left is not None:
                left -= len(chunk)
                if not left:
                    break
    return h.hexdigest()


def free_bytes(path):
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def open_root(dest, create):
    path = os.path.abspath(os.path.expanduser(dest))
    if not os.path.exists(path):
        if not create:
            return os.path.realpath(path), False
        try:
            os.makedirs(path)
        except OSError:  # reported as not writable, with the user's name, by the caller
            return os.path.realpath(path), False
    if not os.path.isdir(path):
        raise Refused("the destination %s exists and is not a directory" % path)
    return os.path.realpath(path), True


def scan(job):
    root, exists = open_root(job["dest"], create=not job["dry_run"])
    answer = {"root": root, "exists": exists, "files": {}, "dirs": [], "parts": {}, "links": [],
              "free": None, "writable": False}
    if not exists:
        parent = os.path.dirname(root)
        while parent and not os.path.isdir(parent):
            parent = os.path.dirname(parent)
        answer["writable"] = bool(parent) and os.access(parent, os.W_OK | os.X_OK)
        answer["free"] = free_bytes(parent or "/")
        return answer
    answer["writable"] = os.access(root, os.W_OK | os.X_OK)
    answer["free"] = free_bytes(root)
    only = job.get("only")  # top-level names to scan (hrmctl setup: the project's, not .venv or data)
    if only is None:
        walk(root, "", answer, job["checksum"], job["dry_run"])
        return answer
    for name in only:
        path = os.path.join(root, name)
        if os.path.isdir(path) and not os.path.islink(path):
            answer["dirs"].append(name)
            walk(path, name + "/", answer, job["checksum"], job["dry_run"])
        elif os.path.lexists(path):
            st = os.lstat(path)
            if stat.S_ISREG(st.st_mode):
                answer["files"][name] = [st.st_size, st.st_mtime_ns, None]
            else:
                answer["links"].append(name)
    return answer


def walk(top, base, answer, checksum, dry_run):
    """Fill answer's files/dirs/parts/links from the tree under top (symlinks are not followed)."""
    files, parts = answer["files"], answer["parts"]
    with os.scandir(top) as entries:
        for entry in entries:
            rel = base + entry.name
            if entry.is_dir(follow_symlinks=False):
                answer["dirs"].append(rel)
                walk(entry.path, rel + "/", answer, checksum, dry_run)
                continue
            is_file = entry.is_file(follow_symlinks=False)
            if entry.name.endswith(PART_SUFFIX) and final_of_part(rel) is not None:
                if not is_file:  # our reserved name, never written through
                    if not dry_run:
                        os.unlink(entry.path)
                    continue
                parts[final_of_part(rel)] = [entry.stat(follow_symlinks=False).st_size, sha256_file(entry.path)]
            elif not is_file:
                answer["links"].append(rel)
            else:
                st = entry.stat(follow_symlinks=False)
                files[rel] = [st.st_size, st.st_mtime_ns, sha256_file(entry.path, size=st.st_size) if checksum else None]


def mkdirs(job):
    root = os.path.realpath(os.path.expanduser(job["dest"]))
    for rel in job["dirs"]:
        path = inside(root, rel)
        if os.path.islink(path):
            raise Refused("%s is a symlink on the node where the source has a directory; remove it" % path)
        if not os.path.isdir(path):
            try:
                os.mkdir(path)
            except OSError as exc:
                raise Refused("cannot create %s: %s" % (path, exc.strerror))
    return {}


def finalize(job):
    root = os.path.realpath(os.path.expanduser(job["dest"]))
    done, bad, checked = [], [], set()
    for rel, size, mtime_ns, mode, digest in job["files"]:
        final = inside(root, rel, checked)
        head, name = os.path.split(final)
        part = os.path.join(head, "." + name + PART_SUFFIX)
        try:
            st = os.lstat(part)
        except OSError:
            bad.append([rel, "the sent file is missing on the node"])
            continue
        got = sha256_file(part, size=st.st_size) if stat.S_ISREG(st.st_mode) else None
        if st.st_size != size or got != digest:
            os.unlink(part)
            bad.append([rel, "size %d sha256 %s, expected %d %s" % (st.st_size, (got or "-")[:12], size, digest[:12])])
            continue
        if stat.S_IMODE(st.st_mode) != mode & 0o7777:
            os.chmod(part, mode & 0o7777)
        os.utime(part, ns=(mtime_ns, mtime_ns))
        try:
            os.replace(part, final)
        except (IsADirectoryError, NotADirectoryError):
            os.unlink(part)
            bad.append([rel, "a directory of that name is on the node"])
            continue
        done.append(rel)
    removed = []
    for rel in job.get("stale_parts", []):
        part = inside(root, part_name(rel))
        if os.path.lexists(part):
            os.unlink(part)
    for rel in job.get("delete", []):
        path = inside(root, rel)
        if os.path.islink(path) or os.path.isfile(path):
            os.unlink(path)
            removed.append(rel)
        elif os.path.isdir(path):
            try:
                os.rmdir(path)  # deepest first; a directory that still holds kept files stays
                removed.append(rel + "/")
            except OSError:
                pass
    return {"done": done, "bad": bad, "removed": removed}


def read_exact(stream, n):
    data = stream.read(n) if n else b""
    if len(data) != n:
        raise EOFError("the input ended inside a batch of files")
    return data


def umask(cache=[]):
    if not cache:
        cache.append(os.umask(0o022))
        os.umask(cache[0])
    return cache[0]


def put_one(root, checked, rel, data, mtime_ns, mode, digest):
    """Write one small file to its part name, verify, rename it; the reason if it is bad."""
    final = inside(root, rel, checked)
    head, _, name = final.rpartition("/")
    part = head + "/." + name + PART_SUFFIX
    try:  # a new file, so its mode is known: (mode & 0o777) minus the umask
        fd = os.open(part, NEW_FILE, mode & 0o777)
    except FileExistsError:  # left by an earlier run
        os.unlink(part)
        fd = os.open(part, NEW_FILE, mode & 0o777)
    try:
        done = os.write(fd, data)
        if done < len(data):  # a regular file takes it all at once, unless the disk is full
            view = memoryview(data)
            while done < len(data):
                done += os.write(fd, view[done:])
        got = hashlib.sha256(data).hexdigest()  # what the node was given: a corrupted batch shows here
        if got != digest:
            os.close(fd)
            fd = -1
            os.unlink(part)
            return "sha256 %s, expected %s" % (got[:12], digest[:12])
        if mode & 0o7777 != mode & 0o777 & ~umask():
            os.fchmod(fd, mode & 0o7777)
        os.utime(fd, ns=(mtime_ns, mtime_ns))
    except BaseException:
        if fd >= 0:
            os.close(fd)
            fd = -1
        if os.path.lexists(part):
            os.unlink(part)
        raise
    finally:
        if fd >= 0:
            os.close(fd)
    try:
        os.replace(part, final)
    except (IsADirectoryError, NotADirectoryError):
        os.unlink(part)
        return "a directory of that name is on the node"
    return None


def put(job):
    """job["data"]: the files' bytes back to back (read with the job line by serve())."""
    root = os.path.realpath(os.path.expanduser(job["dest"]))
    done, bad, checked = [], [], set()
    failed = refused = None
    data, pos = memoryview(job["data"]), 0
    for rel, size, mtime_ns, mode, digest in job["files"]:
        chunk, pos = data[pos:pos + size], pos + size
        try:
            why = put_one(root, checked, rel, chunk, mtime_ns, mode, digest)
        except Refused as exc:
            refused = str(exc)
            break
        except OSError as exc:
            code = 3 if exc.errno in (errno.EACCES, errno.EPERM) else 4
            failed = [rel, "writing %s failed: %s" % (part_name(rel), exc.strerror or exc), code]
            break
        if why is None:
            done.append(rel)
        else:
            bad.append([rel, why])
    return {"done": done, "bad": bad, "failed": failed, "refused": refused}


def space(job):
    root = os.path.realpath(os.path.expanduser(job["dest"]))
    return {"free": free_bytes(root if os.path.isdir(root) else os.path.dirname(root))}


def handle(job):
    try:
        answer = {"scan": scan, "mkdirs": mkdirs, "finalize": finalize, "put": put, "space": space}[job["op"]](job)
        answer["ok"] = True
    except Refused as exc:
        answer = {"ok": False, "error": str(exc)}
    except OSError as exc:
        answer = {"ok": False, "error": "%s: %s" % (getattr(exc, "filename", None) or "", exc.strerror or exc)}
    except Exception as exc:  # a bug must still come back as an answer
        answer = {"ok": False, "error": "%s: %s" % (type(exc).__name__, exc)}
    return answer


def serve():
    """One JSON job per stdin line, one JSON answer per stdout line, in order, until stdin closes.

    A put job's file bytes follow its line; they are read here, so the next job (and its bytes)
    is read while a worker thread handles this one. While a job runs (hashing can take minutes),
    a line {"alive": true} every HEARTBEAT_S seconds tells the other side that the node is alive, so that
    silence can mean a dead link."""
    import queue
    import threading
    import time
    jobs = queue.Queue(maxsize=1)   # one job read ahead while another is handled
    busy = []                       # the start time of the job being handled

    def work():
        while True:
            job = jobs.get()
            if job is None:
                return
            busy.append(time.monotonic())
            answer = encode(handle(job))
            busy.pop()
            write(answer)

    def beat():
        while True:
            time.sleep(HEARTBEAT_S / 2)
            started = busy[0] if busy else None
            if started is not None and time.monotonic() - started >= HEARTBEAT_S / 2:
                say({"alive": True})

    worker = threading.Thread(target=work)
    worker.start()
    threading.Thread(target=beat, daemon=True).start()
    stdin = sys.stdin.buffer
    try:
        while True:
            line = stdin.readline()
            if not line:
                return
            if not line.strip():
                continue
            job = json.loads(line)
            if job.get("op") == "put":  # its files' bytes follow the line
                job["data"] = read_exact(stdin, sum(f[1] for f in job["files"]))
            jobs.put(job)
    except EOFError:  # the other side is gone in the middle of a batch
        return
    finally:
        jobs.put(None)
        worker.join()


def main(argv):
    serve()
    return 0
