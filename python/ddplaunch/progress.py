"""Progress reports from a Python worker to `launch`: call `ddplaunch.step()` once per step.

launch gives each worker a small shared-memory file and names its descriptor in
DDPL_HEARTBEAT_FD (the layout is common/heartbeat.h): the step count as a little-endian 64-bit
integer at offset 0, and the microseconds spent so far waiting inside collectives at offset 8.
From the step count launch shows progress and the end-of-run summary and finds hung ranks; from
the waits it tells a slow rank from the ranks that wait for it (stragglers). `ddplaunch.done()`
after the last step (offset 24) tells launch that what follows is teardown, not a hang; the
interpreter's exit says so by itself for a process that reported steps. ddplaunch.checkpoint
reports the time it spent restoring (offset 16) and the step it resumed from and its source
(offsets 32 and 40), for a restart's phases and launch's incident table.

Without launch (torchrun, a plain `python train.py`), or when the descriptor is not launch's,
every call only keeps the local count: no exception, no system call. The variable is read and
the file mapped once, at the first call, so that importing ddplaunch stays free.

Calls are meant for the training loop's thread: the counters are plain Python integers, not
atomics. A call costs about 0.1 µs under launch or not (one store to the mapped file).
"""
import os
import stat
import sys
import time

from . import _env

__all__ = ["step", "current", "done", "add_wait", "waiting", "enabled"]

_FD_ENV = _env.HEARTBEAT_FD
# Slots of 8 bytes in the shared file (common/heartbeat.h: kHeartbeatStepOffset, ...WaitOffset).
_STEP_SLOT = 0
_WAIT_SLOT = 1
_RESTORE_SLOT = 2  # kHeartbeatRestoreOffset: microseconds spent reading checkpoints
_FINISHED_SLOT = 3  # kHeartbeatFinishedOffset: the step count it finished at, plus one
_RESTORED_SLOT = 4  # kHeartbeatRestoredStepOffset: the step resumed from, plus one
_SOURCE_SLOT = 5  # kHeartbeatRestoreSourceOffset: where it came from (_SOURCE_CODES)
_MAPPED_BYTES = 48
_SOURCE_CODES = {"memory": 1, "peer": 2, "disk": 3}
_MAX = 1 << 64

# None until the first call; then the writable slots, or False where launch does not listen.
_slots = None
_step = 0
_waited_ns = 0


class _LittleEndianSlots:
    """The slots on a big-endian machine, where a native 'Q' store would reverse the bytes."""

    def __init__(self, buf):
        self._buf = buf

    def __setitem__(self, i, value):
        self._buf[i * 8:i * 8 + 8] = value.to_bytes(8, "little")


def _open():
    global _slots
    _slots = False
    # The flight recorder's answer to launch on a hang (ddplaunch/_flight_recorder.py): started
    # here, at the first call, when torch.distributed is usually set up and importing ddplaunch
    # stays free. Nothing happens without launch.
    from ddplaunch import _flight_recorder

    _flight_recorder.start()
    try:
        fd = int(os.environ[_FD_ENV])
        if fd < 0:
            return
        st = os.fstat(fd)
        # The variable outlives the descriptor in the worker's own children (subprocess closes
        # inherited descriptors, and the number may then name another file): write only to an
        # anonymous regular file (launch's memfd has no name on disk) that holds every field,
        # never into a file someone could find by name.
        if not stat.S_ISREG(st.st_mode) or st.st_nlink != 0 or st.st_size < _MAPPED_BYTES:
            return
        import mmap

        buf = mmap.mmap(fd, _MAPPED_BYTES, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    except (KeyError, ValueError, OSError):
        return
    # A native 64-bit store into the mapping, as the C++ worker does: launch may read the field
    # at any moment, and one aligned store never shows it half written (a pwrite costs 10x more).
    _slots = memoryview(buf).cast("Q") if sys.byteorder == "little" else _LittleEndianSlots(buf)
    # The interpreter's exit is teardown too (atexit handlers run before the modules' teardown;
    # those registered earlier, torch's among them, run after this one). Not in a forked child
    # that exits on its own: the mapping is shared, and the parent may still be stepping.
    import atexit

    atexit.register(_done_at_exit, os.getpid())


def step(n=None):
    """Report that step `n` is done, or without `n` the step after the last one reported.

    Steps count from 1 (launch reads 0 as "reports no steps yet"); `n` may go back, e.g. when
    training resumes from a checkpoint. Returns the step count now reported.
    """
    global _step
    if n is None:
        n = _step + 1
    elif n.__class__ is not int:
        import operator  # only here, as ints are the rule: importing ddplaunch stays free

        n = operator.index(n)  # a numpy integer, a one-element integer tensor
    if not 0 <= n < _MAX:
        raise ValueError(f"ddplaunch.step: {n} is not a step count (0 to 2**64-1)")
    _step = n
    if _slots is None:
        _open()
    if _slots:
        _slots[_STEP_SLOT] = n
    return n


def current():
    """The last step reported by step() (0 before the first)."""
    return _step


def done():
    """Report that this rank made its last step: what it does from now on (a final save,
    destroy_process_group, the interpreter's exit) is teardown, not a hang.

    launch takes a rank that makes no step for its hang limit (--hang-timeout) for hung; a rank
    that called done() is held to --hang-finish-timeout (600 s) instead. A step() after it
    cancels it. The interpreter's exit calls it by itself in a process that has made any
    of this module's calls (not os._exit, which skips exit handlers).
    """
    if _slots is None:
        _open()
    if _slots:
        # After the step it names: launch takes the mark only while it matches the step count.
        _slots[_FINISHED_SLOT] = _step + 1


def _done_at_exit(pid):
    if os.getpid() == pid:
        done()


def add_wait(seconds):
    """Add time this rank spent waiting inside a collective (all-reduce, barrier...).

    launch subtracts it from the rank's step time, so that the ranks that wait for a slow one
    are not taken for stragglers themselves. Reporting waits is optional.
    """
    ns = int(seconds * 1e9)
    if ns < 0:
        raise ValueError(f"ddplaunch.add_wait: {seconds} is negative")
    _add_wait_ns(ns)


def _add_wait_ns(ns):
    global _waited_ns
    _waited_ns += ns
    if _slots is None:
        _open()
    if _slots:
        _slots[_WAIT_SLOT] = _waited_ns // 1000  # launch adds up microseconds


_restore_ns = 0


def _add_restore_ns(ns):
    """Time spent restoring from a checkpoint (ddplaunch.checkpoint.latest and load): launch
    shows it in a restart's phases."""
    global _restore_ns
    _restore_ns += ns
    if _slots is None:
        _open()
    if _slots:
        _slots[_RESTORE_SLOT] = _restore_ns // 1000


def _set_restored(step, source):
    """The checkpoint this process resumes from (ddplaunch.checkpoint.latest): launch's
    incident table counts the steps redone from it and says where it came from. The step first:
    launch takes a rank's steps for global once it sees a restored step."""
    if _slots is None:
        _open()
    if _slots and 0 <= step < _MAX - 1:
        _slots[_RESTORED_SLOT] = step + 1
        _slots[_SOURCE_SLOT] = _SOURCE_CODES.get(source, 0)


class waiting:
    """`with ddplaunch.waiting(): dist.all_reduce(t)`: adds the block's time with add_wait()."""

    __slots__ = ("_start",)

    def __enter__(self):
        self._start = time.perf_counter_ns()
        return self

    def __exit__(self, *exc):
        _add_wait_ns(time.perf_counter_ns() - self._start)
        return False


def enabled():
    """True when this process's reports reach launch (DDPL_HEARTBEAT_FD names its file)."""
    if _slots is None:
        _open()
    return bool(_slots)
