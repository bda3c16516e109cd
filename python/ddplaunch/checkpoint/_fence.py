"""The fence (docs/network-faults.md): a write from a round older than the newest that committed
to a directory is refused. The same file and rules as launch's and the C++ library's
(common/checkpoint_files.h FenceGuard)."""
import contextlib
import errno
import fcntl
import os
import stat
import time

from . import _job
from ._files import makedirs
from ._format import FENCE, FENCE_MAX, decode_fence, describe_fence, encode_fence, fence_refuses
from ._types import StaleRoundError

LOCK_SECONDS = 60


@contextlib.contextmanager
def fence(d, what):
    """Held across a commit into d: refuses (StaleRoundError) when a newer round of the same run
    committed there, else records this round as the newest."""
    mine = _job.fence_token()
    if mine is None:
        yield
        return
    makedirs(d)
    path = os.path.join(d, FENCE)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(f"cannot use {path}: not a regular file")
        deadline = time.monotonic() + LOCK_SECONDS
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
                    raise TimeoutError(f"cannot lock {path} within {LOCK_SECONDS}s: "
                                       f"another writer holds it ({what})") from None
                time.sleep(0.01)
        newest = decode_fence(os.pread(fd, FENCE_MAX + 1, 0))
        if fence_refuses(newest, mine):
            raise StaleRoundError(
                f"{what} refused: this process belongs to {describe_fence(mine)}, but "
                f"{describe_fence(newest)} has committed to {d} since. Its group is stale (its "
                f"node lost the rendezvous and the job re-formed without it): this process "
                f"should stop.")
        if newest != mine:
            data = encode_fence(mine)
            os.ftruncate(fd, 0)
            os.pwrite(fd, data, 0)
            os.fsync(fd)
        yield
    finally:
        os.close(fd)  # releases the lock
