"""torch.save and torch.load as checkpoints: save() is begin, torch.save, commit, and stops
writing memory at the budget (then writes to the durable directory instead)."""
import os
import time

from .. import progress as _progress
from . import _job
from ._commit import make_record
from ._disk import begin_disk, commit_disk, durable_path
from ._files import NEW_FILE, list_files, makedirs, rmtree
from ._memory import held_bytes, memory_dir, over_budget
from ._types import Checkpoint, api


class _OverBudget(Exception):
    pass


class _BudgetFile:
    """A write-only file that stops at `limit` bytes (torch.save writes through it), so a
    state larger than the budget never fills /dev/shm."""

    def __init__(self, path, limit):
        self.fd = os.open(path, NEW_FILE, 0o600)
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

    makedirs(os.path.dirname(path))
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
    step = _job.check_step(step)
    rank, _ = _job.rank_world()
    mem = memory_dir(rank, create=True)
    if mem is None and replicated and rank != 0:
        d = _job.durable_dir(dir, True)
        return Checkpoint(step, durable_path(d, step, flat), "disk", rank)  # rank 0 writes it
    path = api().begin(step, dir)
    budget = _job.budget() if mem is not None else None
    held = held_bytes(mem, step) if budget is not None else 0
    limit = None if budget is None else max(0, budget - held)
    # In memory, the CRCs of torch.save's records would double the time the training loop
    # waits (100 MB: 70 ms against 36 ms); the record's sizes catch torn writes.
    if _torch_save(obj, os.path.join(path, filename), limit, crc=mem is None):
        return api().commit(step, dir, replicated, persist, keep, flat)
    rmtree(path)
    d = _job.durable_dir(dir, required=False)
    over_budget(step, f"more than {limit} bytes", budget, held, durable_path(d, step, flat))
    if d is None or (replicated and rank != 0):
        return Checkpoint(step, durable_path(d, step, flat), "disk", rank) if d else None
    path = begin_disk(d, step, rank, os.getpid())
    os.mkdir(path, 0o700)
    _torch_save(obj, os.path.join(path, filename))
    _, world = _job.rank_world()
    record = make_record(step, rank, world, list_files(path), durable_path(d, step, flat),
                         persist, replicated, keep)
    return commit_disk(path, record, d)


def load(checkpoint, filename="state.pt", **torch_load_kwargs):
    """torch.load of `filename` in the checkpoint's directory."""
    import torch

    start = time.perf_counter_ns()
    try:
        return torch.load(os.path.join(checkpoint.path, filename), **torch_load_kwargs)
    finally:
        _progress._add_restore_ns(time.perf_counter_ns() - start)
