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

The modules, by concern: _format (names and encodings, pure), _job (what the environment
says), _files, _fence, _memory (the memory tier), _disk (the durable layout and retention),
_commit (begin and commit on either), _agree (latest: offers and the agreement), _save
(torch.save/load), _async (save_async), _dcp.
"""
from ._agree import latest
from ._async import PendingSave, save_async, wait
from ._commit import begin, commit
from ._format import RECORD, VERSION  # noqa: F401
from ._save import _BudgetFile, load, save  # noqa: F401  (_BudgetFile: the tests' spy)
from ._types import Checkpoint, StaleRoundError

__all__ = ["Checkpoint", "StaleRoundError", "begin", "commit", "latest", "save", "save_async",
           "wait", "load",
           "PendingSave", "StorageWriter", "StorageReader"]


def __getattr__(name):
    # The DCP classes subclass torch's: built on first use, so importing this module stays free.
    if name in ("StorageWriter", "StorageReader"):
        from ._dcp import classes

        return classes()[name]
    raise AttributeError(f"module 'ddplaunch.checkpoint' has no attribute {name!r}")
