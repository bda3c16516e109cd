"""The memory tier (launch's root on /dev/shm, docs/checkpoints.md): a rank's directory, a
step's partial directory and its commit by rename, keep, the budget, and the steps a rank can
read back. The C++ side of the same is common/checkpoint_files.h."""
import errno
import os
import stat
import sys
import warnings

from . import _job
from ._fence import fence
from ._files import entries, is_real_dir, read_committed, rmtree, tree_bytes, write_record
from ._format import (RECORD, parse_partial_dir_name, parse_step_dir_name, partial_dir_name,
                      rank_dir_name, step_dir_name)
from ._types import StaleRoundError


def memory_dir(rank, create=False):
    """<root>/rank-<R>, or None where launch gave this rank no memory tier. Readers (create
    False) find None until the rank's first write, which makes the root and the directory:
    launch names the root but makes nothing, so that a job that never checkpoints costs it
    nothing (docs/checkpoints.md)."""
    root = _job.memory_root()
    if not root:
        return None
    path = os.path.join(root, rank_dir_name(rank))
    if create:
        make_private_dir(root)
        make_private_dir(path)
        return path
    try:
        return path if stat.S_ISDIR(os.lstat(path).st_mode) else None
    except FileNotFoundError:
        return None


def make_private_dir(path):
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


def partial_path(mem, step, pid):
    return os.path.join(mem, partial_dir_name(step, pid))


def begin_memory(mem, step, pid):
    """Removes this process's partial directories; returns the new one's path (not made)."""
    for name, _ in entries(mem):
        p = parse_partial_dir_name(name)
        if p is not None and p[1] == pid:
            rmtree(os.path.join(mem, name))
    return partial_path(mem, step, pid)


def commit_memory(mem, partial, record, pid):
    """Writes the record into `partial` and renames it to step-<N> (the commit point), under the
    rank directory's fence; then keep. Returns the committed directory."""
    step, rank = record["step"], record["rank"]
    # Memory is not durable: no fsync (the rename alone orders it for readers on this machine).
    write_record(os.path.join(partial, RECORD), record, durable=False)
    target = os.path.join(mem, step_dir_name(step))
    try:
        with fence(mem, f"checkpoint step {step} of rank {rank}"):
            try:
                os.rename(partial, target)  # the commit point
            except OSError as e:
                if e.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                    raise
                # An earlier attempt committed this step: move it away, then commit.
                away = os.path.join(mem, f"replaced-{step}-{pid}")
                rmtree(away)
                os.rename(target, away)
                os.rename(partial, target)
                rmtree(away)
    except StaleRoundError:
        rmtree(partial)
        raise
    trim_memory(mem, step)
    return target


def held_bytes(mem, step):
    """Bytes of this rank's committed steps other than `step` (which a commit replaces)."""
    total = 0
    for name, st in entries(mem):
        s = parse_step_dir_name(name)
        if s is not None and s != step and is_real_dir(st):
            total += tree_bytes(os.path.join(mem, name))
    return total


def trim_memory(mem, just_committed):
    keep = _job.memory_keep()
    steps = sorted((s for s in (parse_step_dir_name(name) for name, _ in entries(mem))
                    if s is not None), reverse=True)
    kept = set(steps[:keep]) | {just_committed}
    for s in steps:
        if s not in kept:
            rmtree(os.path.join(mem, step_dir_name(s)))


def over_budget(step, size, budget, held, durable):
    where = (f"writing it to {durable} instead (synchronously)" if durable
             else "it is NOT saved (no durable directory: pass dir= or --checkpoint-dir)")
    msg = (f"ddplaunch.checkpoint: step {step} does not fit in this rank's checkpoint memory: "
           f"it is {size}, the budget is {budget} bytes and committed steps already hold "
           f"{held} bytes; {where}. Raise launch's --checkpoint-memory or lower "
           f"--checkpoint-memory-keep.")
    warnings.warn(msg, RuntimeWarning, stacklevel=3)
    print(msg, file=sys.stderr, flush=True)


def memory_steps(mem, rank, world, replicated_only=False):
    """(step, directory) of the valid committed steps of `rank` in `mem` (common/checkpoint_files.h
    listCommitted) for this world size."""
    for name, st in entries(mem):
        step = parse_step_dir_name(name)
        if step is None or not is_real_dir(st):
            continue
        path = os.path.join(mem, name)
        record = read_committed(path, step, rank)
        if (record is not None and record["world_size"] == world
                and (record["replicated"] or not replicated_only)):
            yield step, path
