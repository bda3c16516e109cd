"""Checkpoints in memory under launch, on disk everywhere else (docs/checkpoints.md, format 1).

    from ddplaunch import checkpoint as ckpt
    found = ckpt.latest(dir="ckpt")              # collective: the newest step every rank has
    if found:
        state = ckpt.load(found)
    ckpt.save(model.state_dict(), step, dir="ckpt", replicated=True)

Under launch with the memory tier (DDPL_CHECKPOINT_MEMORY names a root for rank-<RANK>/, which
the first write makes), a checkpoint is a directory on tmpfs that launch persists to `dir` in
the background.
Without it (torchrun, plain python) the same calls write to `dir` directly, with the same
durable layout and markers, so a run may move between the two.

`save_async(obj, step, ...)` blocks only while the state is copied in memory; the write and
the commit run on a thread (`wait()` or the returned PendingSave's result() for the commit).

Any serializer: `path = begin(step)`, write files under path, `commit(step, dir=...)`.
torch.distributed.checkpoint: `StorageWriter(step, dir=...)`, `StorageReader(found)`.

Importing this module does not import torch; save, load, latest (across ranks) and the DCP
classes import it when called.
"""
import atexit
import contextlib
import dataclasses
import errno
import fcntl
import json
import os
import re
import shutil
import stat
import sys
import time
import warnings

from . import progress as _progress

__all__ = ["Checkpoint", "StaleRoundError", "begin", "commit", "latest", "save", "save_async",
           "wait", "load",
           "PendingSave", "StorageWriter", "StorageReader"]

VERSION = 1
RECORD = ".ddpl-commit.json"
_ORIGIN = ".ddpl-origin"  # in a step launch copied from another node's replica
_MEMORY_ENV = "DDPL_CHECKPOINT_MEMORY"
_BUDGET_ENV = "DDPL_CHECKPOINT_MEMORY_BUDGET"
_KEEP_ENV = "DDPL_CHECKPOINT_MEMORY_KEEP"
_DIR_ENV = "DDPL_CHECKPOINT_DIR"
_STEP_DIR = re.compile(r"step-(\d+)\Z")
_MARKER = re.compile(r"\.ddpl-step-(\d+)\.rank-(\d+)\.json\Z")
_ROUND_ENV = "DDPL_ROUND"
_EPOCH_ENV = "DDPL_ROUND_EPOCH"
_RUN_ENV = "TORCHELASTIC_RUN_ID"
_FENCE = ".ddpl-fence"
_FENCE_MAX = 4096
_FENCE_LOCK_SECONDS = 60
_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC

_latest_calls = 0  # numbers latest() calls, so that a call never reads an earlier call's offers
_clients = {}  # TCPStore clients by endpoint, for latest() without a process group


@dataclasses.dataclass(frozen=True)
class Checkpoint:
    """A committed step: read its files from `path`; `source` is "memory", "peer" (launch
    copied it from another node's replica) or "disk"."""
    step: int
    path: str
    source: str
    rank: int


# ---------------------------------------------------------------------------- where things go

class StaleRoundError(RuntimeError):
    """A write from a group older than the newest that committed to the directory: this
    process's node lost the rendezvous and the job re-formed without it (the fence)."""


def _fence_token():
    """(run id, epoch, round) launch gave this worker, or None (no launch, or no epoch)."""
    try:
        epoch = int(os.environ.get(_EPOCH_ENV) or 0)
        rnd = int(os.environ.get(_ROUND_ENV) or 0)
    except ValueError:
        raise ValueError(f"{_EPOCH_ENV}={os.environ.get(_EPOCH_ENV)!r} and "
                         f"{_ROUND_ENV}={os.environ.get(_ROUND_ENV)!r}: integers expected "
                         f"(launch sets them)") from None
    if epoch <= 0 or rnd < 0:
        return None
    return (os.environ.get(_RUN_ENV, ""), epoch, rnd)


def _describe(t):
    return f"round {t[2]} (epoch {t[1]}) of run {t[0]!r}"


def _read_fence(fd):
    data = os.pread(fd, _FENCE_MAX + 1, 0)
    try:
        j = json.loads(data) if 0 < len(data) <= _FENCE_MAX else None
    except ValueError:
        return None
    if (not isinstance(j, dict) or not isinstance(j.get("run_id"), str)
            or type(j.get("epoch")) is not int or type(j.get("round")) is not int
            or j["epoch"] < 0 or j["round"] < 0):
        return None
    return (j["run_id"], j["epoch"], j["round"])


@contextlib.contextmanager
def _fence(d, what):
    """Held across a commit into d: refuses (StaleRoundError) when a newer round of the same run
    committed there, else records this round as the newest. The same file and rules as launch's
    and the C++ library's (common/checkpoint_files.h FenceGuard)."""
    mine = _fence_token()
    if mine is None:
        yield
        return
    _makedirs(d)
    path = os.path.join(d, _FENCE)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(f"cannot use {path}: not a regular file")
        deadline = time.monotonic() + _FENCE_LOCK_SECONDS
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as e:
                if e.errno in (errno.ENOLCK, errno.EOPNOTSUPP):
                    break  # no locks on this file system: checked, unordered
                if e.errno not in (errno.EWOULDBLOCK, errno.EINTR):
                    raise
                if time.monotonic() >= deadline:
                    raise TimeoutError(f"cannot lock {path} within {_FENCE_LOCK_SECONDS}s: "
                                       f"another writer holds it ({what})") from None
                time.sleep(0.01)
        newest = _read_fence(fd)
        if (newest is not None and newest[0] == mine[0]
                and (mine[1], mine[2]) < (newest[1], newest[2])):
            raise StaleRoundError(
                f"{what} refused: this process belongs to {_describe(mine)}, but "
                f"{_describe(newest)} has committed to {d} since. Its group is stale (its node "
                f"lost the rendezvous and the job re-formed without it): this process should "
                f"stop.")
        if newest != mine:
            data = (json.dumps({"run_id": mine[0], "epoch": mine[1], "round": mine[2]})
                    + "\n").encode()
            os.ftruncate(fd, 0)
            os.pwrite(fd, data, 0)
            os.fsync(fd)
        yield
    finally:
        os.close(fd)  # releases the lock


def _rank_world():
    dist = sys.modules.get("torch.distributed")  # only when the program imported it
    if dist is not None and dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


def _memory_dir(rank, create=False):
    """<root>/rank-<R>, or None where launch gave this rank no memory tier. Readers (create
    False) find None until the rank's first write, which makes the root and the directory:
    launch names the root but makes nothing, so that a job that never checkpoints costs it
    nothing (docs/checkpoints.md)."""
    root = os.environ.get(_MEMORY_ENV)
    if not root:
        return None
    path = os.path.join(root, f"rank-{rank}")
    if create:
        _make_private_dir(root)
        _make_private_dir(path)
        return path
    try:
        return path if stat.S_ISDIR(os.lstat(path).st_mode) else None
    except FileNotFoundError:
        return None


def _make_private_dir(path):
    """mkdir 0700 unless there; either way a real directory of this user that nobody else can
    enter (common/checkpoint_files.h makePrivateDir): one another user made first under the
    root's name is refused, never written into."""
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    st = os.lstat(path)
    if (not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid()
            or stat.S_IMODE(st.st_mode) & 0o077):
        kind = ("a symlink" if stat.S_ISLNK(st.st_mode) else
                "a directory" if stat.S_ISDIR(st.st_mode) else "not a directory")
        raise PermissionError(
            f"refusing to keep checkpoints in {path}: it is {kind} of uid {st.st_uid} with mode "
            f"{stat.S_IMODE(st.st_mode):04o}, not a 0700 directory of uid {os.geteuid()}")


def _durable_dir(dir, required):
    d = os.fspath(dir) if dir is not None else os.environ.get(_DIR_ENV)
    if not d:
        if required:
            raise ValueError("no durable checkpoint directory: pass dir= (e.g. "
                             "ckpt.save(state, step, dir='checkpoints')) or run under launch "
                             "with --checkpoint-dir=DIR")
        return None
    return os.path.abspath(d)


def _durable_path(d, step, flat):
    if not d:
        return ""
    return d if flat else os.path.join(d, f"step-{step}")


def _budget():
    value = os.environ.get(_BUDGET_ENV)
    return int(value) if value else None


def _check_step(step):
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise ValueError(f"step must be a non-negative int, got {step!r}")
    return step


def _disk_partial(d, step, rank, pid):
    return os.path.join(d, f".partial-step-{step}-rank-{rank}-{pid}")


# ---------------------------------------------------------------------------- file helpers

def _rmtree(path):
    shutil.rmtree(path, ignore_errors=True)


def _fsync_dir(path):
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _makedirs(path):
    os.makedirs(path, mode=0o700, exist_ok=True)


def _write_new(path, data):
    fd = os.open(path, _NEW_FILE, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_json_atomic(path, obj):
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        os.unlink(tmp)  # a leftover of this pid's earlier, killed life
    except FileNotFoundError:
        pass
    _write_new(tmp, json.dumps(obj, indent=1).encode())
    os.rename(tmp, path)
    _fsync_dir(os.path.dirname(path))


def _list_files(top):
    """[{"path", "size"}] of the regular files under top; anything else is refused."""
    files = []
    for dirpath, dirnames, filenames in os.walk(top):
        for name in dirnames + filenames:
            full = os.path.join(dirpath, name)
            st = os.lstat(full)
            rel = os.path.relpath(full, top)
            if stat.S_ISDIR(st.st_mode):
                continue
            if not stat.S_ISREG(st.st_mode):
                raise ValueError(f"checkpoint file {rel!r} in {top} is not a regular file "
                                 "(symlinks and special files are refused): write the data "
                                 "itself under the directory begin() returned")
            files.append({"path": rel, "size": st.st_size})
    files.sort(key=lambda f: f["path"])
    return files


def _tree_bytes(top):
    total = 0
    for dirpath, _, filenames in os.walk(top):
        for name in filenames:
            try:
                st = os.lstat(os.path.join(dirpath, name))
            except FileNotFoundError:
                continue
            if stat.S_ISREG(st.st_mode):
                total += st.st_size
    return total


def _safe_rel(rel):
    return (isinstance(rel, str) and rel and not rel.startswith("/")
            and ".." not in rel.split("/"))


def _files_intact(top, files):
    try:
        for f in files:
            if not _safe_rel(f["path"]):
                return False
            st = os.lstat(os.path.join(top, f["path"]))
            if not stat.S_ISREG(st.st_mode) or st.st_size != f["size"]:
                return False
        return True
    except (OSError, KeyError, TypeError):
        return False


def _read_record(path):
    try:
        with open(path, "rb") as f:
            record = json.load(f)
        return record if isinstance(record, dict) and record.get("version") == VERSION else None
    except (OSError, ValueError):
        return None


def _place(src, dst):
    """src's file at dst, durably: rename within a filesystem, else copy under a temporary
    name and rename, so dst is never seen half written."""
    fd = os.open(src, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        try:
            os.fsync(fd)
            os.rename(src, dst)
            return
        except OSError as e:
            if e.errno != errno.EXDEV:
                raise
        tmp = os.path.join(os.path.dirname(dst), f".{os.path.basename(dst)}.tmp-{os.getpid()}")
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        out = os.open(tmp, _NEW_FILE, 0o600)
        try:
            size, offset = os.fstat(fd).st_size, 0
            while offset < size:
                sent = os.sendfile(out, fd, offset, size - offset)
                if sent == 0:
                    raise OSError(errno.EIO, f"{src} shrank while copied to {dst}")
                offset += sent
            os.fsync(out)
        finally:
            os.close(out)
        os.rename(tmp, dst)
    finally:
        os.close(fd)


# ---------------------------------------------------------------------------- write and commit

def begin(step, dir=None):
    """The directory to write step `step` into; commit(step) makes it a checkpoint."""
    step = _check_step(step)
    rank, _ = _rank_world()
    pid = os.getpid()
    mem = _memory_dir(rank, create=True)
    if mem is not None:
        for name in os.listdir(mem):
            if name.startswith("partial-") and name.endswith(f"-{pid}"):
                _rmtree(os.path.join(mem, name))
        path = os.path.join(mem, f"partial-{step}-{pid}")
    else:
        path = _begin_disk(_durable_dir(dir, True), step, rank)
    os.mkdir(path, 0o700)
    return path


def _begin_disk(d, step, rank):
    _makedirs(d)
    # One process writes a rank's checkpoints: another's partial is an earlier attempt's,
    # killed before its commit (no launch here to remove it).
    for name in os.listdir(d):
        if name.startswith(".partial-step-") and f"-rank-{rank}-" in name:
            _rmtree(os.path.join(d, name))
    return _disk_partial(d, step, rank, os.getpid())


def _record(step, rank, world, files, durable, persist, replicated, keep):
    r = {"version": VERSION, "step": step, "rank": rank, "world_size": world,
         "files": files, "bytes": sum(f["size"] for f in files), "durable_path": durable,
         "persist": bool(persist and durable), "replicated": bool(replicated),
         "keep": int(keep), "time": time.time()}
    token = _fence_token()
    if token is not None:  # launch persists the step under the same fence
        r["run_id"], r["epoch"], r["round"] = token
    return r


def commit(step, dir=None, replicated=False, persist=True, keep=2, flat=False):
    """Commits what was written under begin(step)'s directory; returns the Checkpoint (None
    when it went nowhere: over the memory budget with no durable directory).

    replicated: the state is the same on every rank, only rank 0's copy reaches the disk.
    persist: under launch, whether launch copies the step to the durable directory.
    keep: durable steps kept for this rank (0: all). flat: files go into dir itself, not
    dir/step-<N> (for programs that name their files per step).
    """
    step = _check_step(step)
    rank, world = _rank_world()
    pid = os.getpid()
    mem = _memory_dir(rank)
    d = _durable_dir(dir, required=mem is None)
    durable = _durable_path(d, step, flat)
    partial = (os.path.join(mem, f"partial-{step}-{pid}") if mem is not None
               else _disk_partial(d, step, rank, pid))
    if not os.path.isdir(partial) or os.path.islink(partial):
        raise ValueError(f"nothing to commit for step {step}: {partial} does not exist; call "
                         f"begin({step}) first and write the files under the path it returns")
    files = _list_files(partial)
    record = _record(step, rank, world, files, durable, persist, replicated, keep)
    if mem is None:
        return _commit_disk(partial, record, d)

    budget, held = _budget(), _held_bytes(mem, step)
    if budget is not None and record["bytes"] > budget - held:
        _over_budget(step, f"{record['bytes']} bytes", budget, held, durable)
        return _commit_disk(partial, record, d)
    with os.fdopen(os.open(os.path.join(partial, RECORD), _NEW_FILE, 0o600), "w") as f:
        json.dump(record, f, indent=1)
    target = os.path.join(mem, f"step-{step}")
    try:
        with _fence(mem, f"checkpoint step {step} of rank {rank}"):
            try:
                os.rename(partial, target)  # the commit point
            except OSError as e:
                if e.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                    raise
                # An earlier attempt committed this step: move it away, then commit.
                away = os.path.join(mem, f"replaced-{step}-{pid}")
                _rmtree(away)
                os.rename(target, away)
                os.rename(partial, target)
                _rmtree(away)
    except StaleRoundError:
        _rmtree(partial)
        raise
    _trim_memory(mem, step)
    return Checkpoint(step, target, "memory", rank)


def _held_bytes(mem, step):
    """Bytes of this rank's committed steps other than `step` (which a commit replaces)."""
    total = 0
    for name in os.listdir(mem):
        m = _STEP_DIR.match(name)
        if m and int(m.group(1)) != step:
            total += _tree_bytes(os.path.join(mem, name))
    return total


def _trim_memory(mem, just_committed):
    keep = max(1, int(os.environ.get(_KEEP_ENV) or 1))
    steps = sorted((int(m.group(1)) for m in map(_STEP_DIR.match, os.listdir(mem)) if m),
                   reverse=True)
    kept = set(steps[:keep]) | {just_committed}
    for s in steps:
        if s not in kept:
            _rmtree(os.path.join(mem, f"step-{s}"))


def _over_budget(step, size, budget, held, durable):
    where = (f"writing it to {durable} instead (synchronously)" if durable
             else "it is NOT saved (no durable directory: pass dir= or --checkpoint-dir)")
    msg = (f"ddplaunch.checkpoint: step {step} does not fit in this rank's checkpoint memory: "
           f"it is {size}, the budget is {budget} bytes and committed steps already hold "
           f"{held} bytes; {where}. Raise launch's --checkpoint-memory or lower "
           f"--checkpoint-memory-keep.")
    warnings.warn(msg, RuntimeWarning, stacklevel=3)
    print(msg, file=sys.stderr, flush=True)


def _commit_disk(partial, record, d):
    """Moves the files of `partial` into the durable layout, marker last, then retention."""
    step, rank = record["step"], record["rank"]
    durable = record["durable_path"]
    if not durable:
        _rmtree(partial)
        return None
    if record["replicated"] and rank != 0:
        _rmtree(partial)  # rank 0 writes the one copy on disk
        return Checkpoint(step, durable, "disk", rank)
    try:
        with _fence(d, f"checkpoint step {step} of rank {rank}"):
            _place_disk(partial, record, durable)
    except StaleRoundError:
        _rmtree(partial)
        raise
    _retention(d, rank, record["keep"])
    return Checkpoint(step, durable, "disk", rank)


def _place_disk(partial, record, durable):
    step, rank = record["step"], record["rank"]
    _makedirs(durable)
    marker = os.path.join(durable, f".ddpl-step-{step}.rank-{rank}.json")
    try:
        os.unlink(marker)  # an earlier attempt's: the step is not on disk until the new one
        _fsync_dir(durable)
    except FileNotFoundError:
        pass
    dirs = {durable}
    for f in record["files"]:
        dst = os.path.join(durable, f["path"])
        dirs.add(os.path.dirname(dst))
        _makedirs(os.path.dirname(dst))
        _place(os.path.join(partial, f["path"]), dst)
    for path in dirs:
        _fsync_dir(path)
    _write_json_atomic(marker, record)
    _rmtree(partial)


def _markers(d, rank):
    """{step: marker path} of `rank` in d (flat) and d/step-*/."""
    found = {}
    try:
        names = os.listdir(d)
    except FileNotFoundError:
        return found
    for name in names:
        m = _MARKER.match(name)
        if m and int(m.group(2)) == rank:
            found.setdefault(int(m.group(1)), os.path.join(d, name))
        m = _STEP_DIR.match(name)
        if m:
            path = os.path.join(d, name, f".ddpl-step-{m.group(1)}.rank-{rank}.json")
            if os.path.isfile(path):
                found[int(m.group(1))] = path
    return found


def _retention(d, rank, keep):
    if keep <= 0:
        return
    markers = _markers(d, rank)
    steps = sorted(markers, reverse=True)
    old = steps[keep:]
    if not old:
        return
    # A file a kept step lists stays (flat layouts may reuse a name).
    kept = set()
    for s in steps[:keep]:
        top = os.path.dirname(markers[s])
        kept.update(os.path.join(top, f["path"]) for f in (_read_record(markers[s]) or {})
                    .get("files", []) if _safe_rel(f.get("path")))
    for s in old:
        top = os.path.dirname(markers[s])
        for f in (_read_record(markers[s]) or {}).get("files", []):
            path = os.path.join(top, f.get("path", ""))
            if _safe_rel(f.get("path")) and path not in kept:
                try:
                    os.unlink(path)
                except FileNotFoundError:
                    pass
        try:
            os.unlink(markers[s])
        except FileNotFoundError:
            pass
        if top != d:
            try:
                os.rmdir(top)  # the last rank to trim the step removes its directory
            except OSError:
                pass


# ---------------------------------------------------------------------------- resume

def _memory_steps(mem, rank, world, replicated_only=False):
    for name in os.listdir(mem):
        m = _STEP_DIR.match(name)
        if not m:
            continue
        path = os.path.join(mem, name)
        record = _read_record(os.path.join(path, RECORD))
        if (record and record.get("step") == int(m.group(1)) and record.get("rank") == rank
                and record.get("world_size") == world
                and (record.get("replicated") is True or not replicated_only)
                and isinstance(record.get("files"), list)
                and _files_intact(path, record["files"])):
            yield record["step"], path


def _node_ranks(rank):
    """The other ranks of this node: launch numbers a node's ranks contiguously."""
    try:
        local, local_world = int(os.environ["LOCAL_RANK"]), int(os.environ["LOCAL_WORLD_SIZE"])
    except (KeyError, ValueError):
        return []
    first = rank - local
    return [r for r in range(first, first + local_world) if r != rank and r >= 0]


def _disk_steps(d, rank):
    found = {}
    for r in (rank, 0):
        for step, marker in _markers(d, r).items():
            if step in found:
                continue
            record = _read_record(marker)
            if (record and record.get("step") == step and record.get("rank") == r
                    and (r == rank or record.get("replicated") is True)
                    and isinstance(record.get("files"), list)
                    and _files_intact(os.path.dirname(marker), record["files"])):
                found[step] = os.path.dirname(marker)
    return found


def latest(dir=None, store=None, timeout=300):
    """The newest step every rank can read, as a Checkpoint for this rank (its own memory copy
    where it has one, else the durable directory), or None. Collective: every rank calls it,
    the same number of times. The offers meet in `store`, else the default process group's
    store, else a TCPStore client of MASTER_ADDR:MASTER_PORT."""
    start = time.perf_counter_ns()
    try:
        return _latest(dir, store, timeout)
    finally:  # part of a restart's time, which launch reports by phase
        _progress._add_restore_ns(time.perf_counter_ns() - start)


def _latest(dir, store, timeout):
    global _latest_calls
    wait()  # this process's own save in flight counts
    call, _latest_calls = _latest_calls, _latest_calls + 1
    rank, world = _rank_world()
    offers = {}
    mem = _memory_dir(rank)
    if mem is not None:
        for step, path in _memory_steps(mem, rank, world):
            # launch fetched it from another node's replica: say so
            source = "peer" if os.path.lexists(os.path.join(path, _ORIGIN)) else "memory"
            offers[step] = Checkpoint(step, path, source, rank)
        # A replicated state is the same on every rank: the node's other ranks' copies serve
        # too (when one rank died mid-write, the others may hold only the newer step).
        for other in _node_ranks(rank):
            theirs = _memory_dir(other)
            if theirs is None:
                continue
            for step, path in _memory_steps(theirs, other, world, replicated_only=True):
                offers.setdefault(step, Checkpoint(step, path, "memory", rank))
    d = _durable_dir(dir, required=False)
    if d is not None:
        for step, path in _disk_steps(d, rank).items():
            offers.setdefault(step, Checkpoint(step, path, "disk", rank))
    common = set(offers)
    if world > 1:
        common = _agree(sorted(offers), rank, world, call, store, timeout)
    return offers[max(common)] if common else None


def _agree(steps, rank, world, call, store, timeout):
    from datetime import timedelta

    store = _store(store, timeout)
    prefix = f"ddpl/ckpt/offer/{call}/"
    store.set(f"{prefix}{rank}", json.dumps(steps))
    keys = [f"{prefix}{r}" for r in range(world)]
    try:
        store.wait(keys, timedelta(seconds=timeout))
    except Exception as e:
        raise RuntimeError(f"ddplaunch.checkpoint.latest(): not every rank offered its steps "
                           f"within {timeout} s ({e}); every rank must call latest(), the same "
                           "number of times") from e
    common = None
    for key in keys:
        theirs = set(json.loads(store.get(key)))
        common = theirs if common is None else common & theirs
    return common


def _store(store, timeout):
    if store is not None:
        return store
    from datetime import timedelta

    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.distributed_c10d._get_default_store()
    addr, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    if not addr or not port:
        raise RuntimeError("ddplaunch.checkpoint.latest() with WORLD_SIZE > 1 needs the job's "
                           "store: call torch.distributed.init_process_group first, pass "
                           "store=, or set MASTER_ADDR and MASTER_PORT")
    key = (addr, int(port))
    if key not in _clients:
        _clients[key] = dist.TCPStore(addr, int(port), is_master=False,
                                      timeout=timedelta(seconds=timeout))
    return _clients[key]


# ---------------------------------------------------------------------------- torch.save / load

class _OverBudget(Exception):
    pass


class _BudgetFile:
    """A write-only file that stops at `limit` bytes (torch.save writes through it), so a
    state larger than the budget never fills /dev/shm."""

    def __init__(self, path, limit):
        self.fd = os.open(path, _NEW_FILE, 0o600)
        self.limit = limit
        self.written = 0
        self.over = False

    def write(self, data):
        view = memoryview(data).cast("B")
        if self.limit is not None and self.written + len(view) > self.limit:
            self.over = True  # torch.save turns the exception into its own RuntimeError
            raise _OverBudget()
        n = len(view)
        while view:
            view = view[os.write(self.fd, view):]
        self.written += n
        return n

    def flush(self):
        pass

    def close(self):
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def _torch_save(obj, path, limit=None, crc=True):
    """Returns False when the write stopped at `limit`."""
    import torch
    from torch import serialization

    _makedirs(os.path.dirname(path))
    f = _BudgetFile(path, limit)
    crc_before = serialization.get_crc32_options()
    try:
        serialization.set_crc32_options(crc and crc_before)
        torch.save(obj, f)
        return True
    except BaseException:
        if f.over:
            return False
        raise
    finally:
        serialization.set_crc32_options(crc_before)
        f.close()


def save(obj, step, dir=None, replicated=False, persist=True, keep=2, flat=False,
         filename="state.pt"):
    """torch.save(obj) as step `step` (begin, torch.save, commit); returns the Checkpoint."""
    step = _check_step(step)
    rank, _ = _rank_world()
    mem = _memory_dir(rank, create=True)
    if mem is None and replicated and rank != 0:
        d = _durable_dir(dir, True)
        return Checkpoint(step, _durable_path(d, step, flat), "disk", rank)  # rank 0 writes it
    path = begin(step, dir)
    budget = _budget() if mem is not None else None
    held = _held_bytes(mem, step) if budget is not None else 0
    limit = None if budget is None else max(0, budget - held)
    # In memory, the CRCs of torch.save's records would double the time the training loop
    # waits (100 MB: 70 ms against 36 ms); the record's sizes catch torn writes.
    if _torch_save(obj, os.path.join(path, filename), limit, crc=mem is None):
        return commit(step, dir, replicated, persist, keep, flat)
    _rmtree(path)
    d = _durable_dir(dir, required=False)
    _over_budget(step, f"more than {limit} bytes", budget, held, _durable_path(d, step, flat))
    if d is None or (replicated and rank != 0):
        return Checkpoint(step, _durable_path(d, step, flat), "disk", rank) if d else None
    path = _begin_disk(d, step, rank)
    os.mkdir(path, 0o700)
    _torch_save(obj, os.path.join(path, filename))
    _, world = _rank_world()
    record = _record(step, rank, world, _list_files(path), _durable_path(d, step, flat),
                     persist, replicated, keep)
    return _commit_disk(path, record, d)


# ---------------------------------------------------------------------------- save_async

_pending = None  # the save_async whose write may still run: (thread, box)
# The last snapshot's tensors, by their place in the state: the next snapshot copies into them.
# Fresh memory costs as much as the write it replaces (the kernel zeroes every new page: 100 MB
# took 50 ms to clone, 15 ms to copy into pages already there), so one copy of the state stays
# in the process between checkpoints.
_staging = {}


def _snapshot(obj, place=()):
    """A copy of `obj` that later training steps cannot change: tensors copied to the CPU
    (into the last snapshot's tensors where they fit), containers rebuilt, other leaves
    deep-copied. Call only with no save in flight: its write reads the staging tensors."""
    import copy

    import torch

    if isinstance(obj, torch.Tensor):
        t = obj.detach()
        if t.layout != torch.strided:  # sparse, nested: a copy of their own
            return t.to("cpu", copy=True) if t.device.type != "cpu" else t.clone()
        held = _staging.get(place)
        if held is None or held.shape != t.shape or held.dtype != t.dtype:
            held = torch.empty(t.shape, dtype=t.dtype, device="cpu")
            _staging[place] = held
        return held.copy_(t)
    if isinstance(obj, dict):
        return obj.__class__((k, _snapshot(v, place + (k,))) for k, v in obj.items())
    if isinstance(obj, (list, tuple)) and obj.__class__ in (list, tuple):
        return obj.__class__(_snapshot(v, place + (i,)) for i, v in enumerate(obj))
    return copy.deepcopy(obj)


class PendingSave:
    """A save_async in flight: result() waits for its commit and returns the Checkpoint (or
    raises what the write raised)."""

    def __init__(self, thread, box):
        self._thread, self._box = thread, box

    def done(self):
        return not self._thread.is_alive()

    def result(self, timeout=None):
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise TimeoutError(f"ddplaunch.checkpoint: step {self._box['step']} not committed "
                               f"within {timeout} s")
        if "error" in self._box:
            raise self._box["error"]
        return self._box.get("result")


def wait(timeout=None):
    """Waits for the last save_async of this process to commit; returns its Checkpoint (None
    when there was none). latest() and the next save_async call it first."""
    global _pending
    if _pending is None:
        return None
    pending = _pending
    result = pending.result(timeout)
    _pending = None
    return result


def save_async(obj, step, dir=None, replicated=False, persist=True, keep=2, flat=False,
               filename="state.pt"):
    """save(), with the training loop blocked only while `obj` is copied in memory; the write
    and the commit run on a thread of this process. Returns a PendingSave. One save in flight
    at a time: the next call waits for the previous one. The process keeps one copy of the
    state's tensors between calls (the copy goes into it). A process killed before the commit
    leaves the step uncommitted, never half offered."""
    import threading

    global _pending
    step = _check_step(step)
    wait()
    try:
        snapshot = _snapshot(obj)
    except Exception:
        _staging.clear()  # half-copied: never reused as it is
        raise
    box = {"step": step}

    def write():
        try:
            box["result"] = save(snapshot, step, dir, replicated, persist, keep, flat, filename)
        except BaseException as e:  # handed to result()
            box["error"] = e

    thread = threading.Thread(target=write, name=f"ddplaunch-ckpt-{step}", daemon=True)
    thread.start()
    _pending = PendingSave(thread, box)
    return _pending


def _wait_at_exit():
    try:
        wait(timeout=600)
    except Exception as e:  # the program is ending: say it, do not mask its own exit
        sys.stderr.write(f"ddplaunch.checkpoint: the last save_async failed: {e}\n")


atexit.register(_wait_at_exit)


def load(checkpoint, filename="state.pt", **torch_load_kwargs):
    """torch.load of `filename` in the checkpoint's directory."""
    import torch

    start = time.perf_counter_ns()
    try:
        return torch.load(os.path.join(checkpoint.path, filename), **torch_load_kwargs)
    finally:
        _progress._add_restore_ns(time.perf_counter_ns() - start)


# ---------------------------------------------------------------------------- DCP

_dcp = {}


def _dcp_classes():
    if _dcp:
        return _dcp
    from pathlib import Path

    from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter
    from torch.distributed.checkpoint.filesystem import FileSystem

    class StorageWriter(FileSystemWriter):
        """dcp.save writer that writes step `step` under begin() and commits every rank's
        files when its part of the save is done (the durable layout is dir/step-<N>, all
        ranks' files together: FileSystemReader(dir/step-<N>) reads it)."""

        def __init__(self, step, dir=None, keep=2, persist=True, **kwargs):
            kwargs.setdefault("sync_files", False)  # commit fsyncs what goes to disk
            self._ddpl = (step, dir, keep, persist)
            self._coordinator = True
            super().__init__(begin(step, dir), **kwargs)

        def set_up_storage_writer(self, is_coordinator, *args, **kwargs):
            super().set_up_storage_writer(is_coordinator, *args, **kwargs)
            self._coordinator = is_coordinator

        def write_data(self, plan, planner):
            future = super().write_data(plan, planner)
            # DCP calls finish() only on the coordinator, which writes .metadata there: the
            # other ranks are done once their files are written. A step some rank did not
            # commit is never agreed on by latest().
            if not self._coordinator and self.use_collectives:
                future.wait()
                self._commit()
            return future

        def finish(self, metadata, results):
            super().finish(metadata, results)
            self._commit()

        def _commit(self):
            step, dir, keep, persist = self._ddpl
            commit(step, dir, replicated=False, persist=persist, keep=keep)

    class _Finder(FileSystem):
        def __init__(self, dirs, step):
            super().__init__()
            self.dirs, self.step = dirs, step

        def concat_path(self, path, suffix):
            for d in self.dirs:
                candidate = os.path.join(d, suffix)
                if os.path.isfile(candidate):
                    return Path(candidate)
            raise FileNotFoundError(
                f"DCP file {suffix!r} of step {self.step} is in none of {self.dirs}: on several "
                "nodes a memory checkpoint can only be read once launch has persisted it; "
                "read it from the durable directory")

    class StorageReader(FileSystemReader):
        """dcp.load reader for a Checkpoint from latest(): from memory, each file is looked
        up in every rank's copy of the step on this node, then in the durable directory."""

        def __init__(self, checkpoint, **kwargs):
            super().__init__(checkpoint.path, **kwargs)
            dirs = [checkpoint.path]
            if checkpoint.source == "memory":
                mem = os.path.dirname(checkpoint.path)
                root = os.path.dirname(mem)
                name = f"step-{checkpoint.step}"
                dirs += sorted(os.path.join(root, r, name) for r in os.listdir(root)
                               if r.startswith("rank-") and os.path.join(root, r) != mem
                               and os.path.isfile(os.path.join(root, r, name, RECORD)))
                durable = (_read_record(os.path.join(checkpoint.path, RECORD)) or {}).get(
                    "durable_path")
                if durable:
                    dirs.append(durable)
            self.fs = _Finder(dirs, checkpoint.step)

    _dcp.update(StorageWriter=StorageWriter, StorageReader=StorageReader)
    return _dcp


def __getattr__(name):
    # The DCP classes subclass torch's: built on first use, so importing this module stays free.
    if name in ("StorageWriter", "StorageReader"):
        return _dcp_classes()[name]
    raise AttributeError(f"module 'ddplaunch.checkpoint' has no attribute {name!r}")
