"""save_async: the training loop waits only while the state is copied in memory; the write and
the commit run on a thread. One save in flight per process."""
import atexit
import sys

from . import _job
from ._types import api

_pending = None  # the save_async whose write may still run
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
    step = _job.check_step(step)
    api().wait()
    try:
        snapshot = _snapshot(obj)
    except Exception:
        _staging.clear()  # half-copied: never reused as it is
        raise
    box = {"step": step}

    def write():
        try:
            box["result"] = api().save(snapshot, step, dir, replicated, persist, keep, flat,
                                       filename)
        except BaseException as e:  # handed to result()
            box["error"] = e

    thread = threading.Thread(target=write, name=f"ddplaunch-ckpt-{step}", daemon=True)
    thread.start()
    _pending = PendingSave(thread, box)
    return _pending


def _wait_at_exit():
    try:
        api().wait(timeout=600)
    except Exception as e:  # the program is ending: say it, do not mask its own exit
        sys.stderr.write(f"ddplaunch.checkpoint: the last save_async failed: {e}\n")


atexit.register(_wait_at_exit)
