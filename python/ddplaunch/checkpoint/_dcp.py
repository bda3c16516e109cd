"""torch.distributed.checkpoint through the tiers: StorageWriter writes a step under begin() and
commits every rank's files; StorageReader reads a Checkpoint from latest(). Built on first use:
the classes subclass torch's, and importing ddplaunch.checkpoint must not import torch."""
import os

from ._files import read_record
from ._format import RECORD, rank_dir_name, step_dir_name
from ._types import api

_classes = {}


def classes():
    if _classes:
        return _classes
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
            super().__init__(api().begin(step, dir), **kwargs)

        def set_up_storage_writer(self, is_coordinator, *args, **kwargs):
            super().set_up_storage_writer(is_coordinator, *args, **kwargs)
            self._coordinator = is_coordinator

        def write_data(self, plan, planner):
            future = super().write_data(plan, planner)
            # DCP calls finish() only on the coordinator, which writes .metadata there: the
            # other ranks are done once their files are written. A step some rank did not
            # commit is never agreed on by latest(). FileSystemWriter has use_collectives
            # (False: every rank finishes alone) only from torch 2.9; before, DCP always used
            # collectives (docs/compat.md: DCP failed on 2.6 and 2.8 without this default).
            if not self._coordinator and getattr(self, "use_collectives", True):
                future.wait()
                self._commit()
            return future

        def finish(self, metadata, results):
            super().finish(metadata, results)
            self._commit()

        def _commit(self):
            step, dir, keep, persist = self._ddpl
            api().commit(step, dir, replicated=False, persist=persist, keep=keep)

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
                name = step_dir_name(checkpoint.step)
                dirs += sorted(os.path.join(root, r, name) for r in os.listdir(root)
                               if r.startswith(rank_dir_name("")) and os.path.join(root, r) != mem
                               and os.path.isfile(os.path.join(root, r, name, RECORD)))
                durable = (read_record(os.path.join(checkpoint.path, RECORD)) or {}).get(
                    "durable_path")
                if durable:
                    dirs.append(durable)
            self.fs = _Finder(dirs, checkpoint.step)

    _classes.update(StorageWriter=StorageWriter, StorageReader=StorageReader)
    return _classes
