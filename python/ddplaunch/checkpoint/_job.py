"""What launch (or torchrun, or nobody) told this process: its rank, its node's ranks, the
round it belongs to, the memory tier's root, budget and keep, the durable directory. Read from
the environment at each call (the names: ddplaunch._env)."""
import os
import sys

from .. import _env


def rank_world():
    dist = sys.modules.get("torch.distributed")  # only when the program imported it
    if dist is not None and dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return int(os.environ.get(_env.RANK, "0")), int(os.environ.get(_env.WORLD_SIZE, "1"))


def node_ranks(rank):
    """The other ranks of this node: launch numbers a node's ranks contiguously."""
    try:
        local = int(os.environ[_env.LOCAL_RANK])
        local_world = int(os.environ[_env.LOCAL_WORLD_SIZE])
    except (KeyError, ValueError):
        return []
    first = rank - local
    return [r for r in range(first, first + local_world) if r != rank and r >= 0]


def fence_token():
    """(run id, epoch, round) launch gave this worker, or None (no launch, or no epoch)."""
    try:
        epoch = int(os.environ.get(_env.ROUND_EPOCH) or 0)
        rnd = int(os.environ.get(_env.ROUND) or 0)
    except ValueError:
        raise ValueError(f"{_env.ROUND_EPOCH}={os.environ.get(_env.ROUND_EPOCH)!r} and "
                         f"{_env.ROUND}={os.environ.get(_env.ROUND)!r}: integers expected "
                         f"(launch sets them)") from None
    if epoch <= 0 or rnd < 0:
        return None
    return (os.environ.get(_env.RUN_ID, ""), epoch, rnd)


def memory_root():
    """The node's memory root launch named, or None: no memory tier for this process."""
    return os.environ.get(_env.CHECKPOINT_MEMORY) or None


def budget():
    """Bytes a rank's memory may hold, or None: no limit."""
    value = os.environ.get(_env.CHECKPOINT_BUDGET)
    return int(value) if value else None


def memory_keep():
    """Committed steps kept in memory per rank (unset or below 1: 1)."""
    return max(1, int(os.environ.get(_env.CHECKPOINT_KEEP) or 1))


def durable_dir(dir, required):
    d = os.fspath(dir) if dir is not None else os.environ.get(_env.CHECKPOINT_DIR)
    if not d:
        if required:
            raise ValueError("no durable checkpoint directory: pass dir= (e.g. "
                             "ckpt.save(state, step, dir='checkpoints')) or run under launch "
                             "with --checkpoint-dir=DIR")
        return None
    return os.path.abspath(d)


def check_step(step):
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise ValueError(f"step must be a non-negative int, got {step!r}")
    return step
