"""Write and commit, on either tier: begin(step) gives the directory to write into, commit(step)
makes what is there a checkpoint (in launch's memory, or in the durable layout without it)."""
import os
import time

from . import _job
from ._disk import begin_disk, commit_disk, disk_partial, durable_path
from ._files import list_files
from ._format import VERSION
from ._memory import (begin_memory, commit_memory, held_bytes, memory_dir, over_budget,
                      partial_path)
from ._types import Checkpoint


def begin(step, dir=None):
    """The directory to write step `step` into; commit(step) makes it a checkpoint."""
    step = _job.check_step(step)
    rank, _ = _job.rank_world()
    pid = os.getpid()
    mem = memory_dir(rank, create=True)
    if mem is not None:
        path = begin_memory(mem, step, pid)
    else:
        path = begin_disk(_job.durable_dir(dir, True), step, rank, pid)
    os.mkdir(path, 0o700)
    return path


def make_record(step, rank, world, files, durable, persist, replicated, keep):
    r = {"version": VERSION, "step": step, "rank": rank, "world_size": world,
         "files": files, "bytes": sum(f["size"] for f in files), "durable_path": durable,
         "persist": bool(persist and durable), "replicated": bool(replicated),
         "keep": int(keep), "time": time.time()}
    token = _job.fence_token()
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
    step = _job.check_step(step)
    rank, world = _job.rank_world()
    pid = os.getpid()
    mem = memory_dir(rank)
    d = _job.durable_dir(dir, required=mem is None)
    durable = durable_path(d, step, flat)
    partial = (partial_path(mem, step, pid) if mem is not None
               else disk_partial(d, step, rank, pid))
    if not os.path.isdir(partial) or os.path.islink(partial):
        raise ValueError(f"nothing to commit for step {step}: {partial} does not exist; call "
                         f"begin({step}) first and write the files under the path it returns")
    files = list_files(partial)
    record = make_record(step, rank, world, files, durable, persist, replicated, keep)
    if mem is None:
        return commit_disk(partial, record, d)

    budget, held = _job.budget(), held_bytes(mem, step)
    if budget is not None and record["bytes"] > budget - held:
        over_budget(step, f"{record['bytes']} bytes", budget, held, durable)
        return commit_disk(partial, record, d)
    target = commit_memory(mem, partial, record, pid)
    return Checkpoint(step, target, "memory", rank)
