"""Resume: latest() collects the steps this rank can read (its memory, its node's other ranks'
replicated copies, the durable directory) and agrees with every other rank, through the job's
store, on the newest step all of them offered."""
import json
import os
import time

from .. import _env
from .. import progress as _progress
from . import _job
from ._disk import disk_steps
from ._format import ORIGIN, agree_on_step
from ._memory import memory_dir, memory_steps
from ._types import Checkpoint, api

_latest_calls = 0  # numbers latest() calls, so that a call never reads an earlier call's offers
_clients = {}  # TCPStore clients by endpoint, for latest() without a process group


def latest(dir=None, store=None, timeout=300):
    """The newest step every rank can read, as a Checkpoint for this rank (its own memory copy
    where it has one, else the durable directory), or None. Collective: every rank calls it,
    the same number of times. The offers meet in `store`, else the default process group's
    store, else a TCPStore client of MASTER_ADDR:MASTER_PORT."""
    start = time.perf_counter_ns()
    try:
        found = _latest(dir, store, timeout)
        if found is not None:  # for launch's incident table: the step resumed from, and where
            _progress._set_restored(found.step, found.source)
        return found
    finally:  # part of a restart's time, which launch reports by phase
        _progress._add_restore_ns(time.perf_counter_ns() - start)


def _latest(dir, store, timeout):
    global _latest_calls
    api().wait()  # this process's own save in flight counts
    call, _latest_calls = _latest_calls, _latest_calls + 1
    rank, world = _job.rank_world()
    offers = {}
    mem = memory_dir(rank)
    if mem is not None:
        for step, path in memory_steps(mem, rank, world):
            # launch fetched it from another node's replica: say so
            source = "peer" if os.path.lexists(os.path.join(path, ORIGIN)) else "memory"
            offers[step] = Checkpoint(step, path, source, rank)
        # A replicated state is the same on every rank: the node's other ranks' copies serve
        # too (when one rank died mid-write, the others may hold only the newer step).
        for other in _job.node_ranks(rank):
            theirs = memory_dir(other)
            if theirs is None:
                continue
            for step, path in memory_steps(theirs, other, world, replicated_only=True):
                offers.setdefault(step, Checkpoint(step, path, "memory", rank))
    d = _job.durable_dir(dir, required=False)
    if d is not None:
        for step, path in disk_steps(d, rank).items():
            offers.setdefault(step, Checkpoint(step, path, "disk", rank))
    steps = sorted(offers)
    everyone = [steps] if world == 1 else _offers(steps, rank, world, call, store, timeout)
    agreed = agree_on_step(everyone)
    return None if agreed is None else offers[agreed]


def _offers(steps, rank, world, call, store, timeout):
    """Every rank's offer, by rank, through the store (docs/checkpoints.md: the key is
    ddpl/ckpt/offer/<call>/<rank>, the value a JSON list of steps)."""
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
    return [json.loads(store.get(key)) for key in keys]


def _store(store, timeout):
    if store is not None:
        return store
    from datetime import timedelta

    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.distributed_c10d._get_default_store()
    addr, port = os.environ.get(_env.MASTER_ADDR), os.environ.get(_env.MASTER_PORT)
    if not addr or not port:
        raise RuntimeError("ddplaunch.checkpoint.latest() with WORLD_SIZE > 1 needs the job's "
                           "store: call torch.distributed.init_process_group first, pass "
                           "store=, or set MASTER_ADDR and MASTER_PORT")
    key = (addr, int(port))
    if key not in _clients:
        _clients[key] = dist.TCPStore(addr, int(port), is_master=False,
                                      timeout=timedelta(seconds=timeout))
    return _clients[key]
