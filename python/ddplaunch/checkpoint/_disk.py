"""The durable layout (docs/checkpoints.md): <dir>/step-<N>/ (or <dir> itself, flat) with each
rank's marker written last, what the module writes there itself without launch, durable
retention, and the steps a rank can read back. The C++ side of the same is
common/checkpoint_files.h (persistStep, listDurable, retireDurable)."""
import os

from ._fence import fence
from ._files import (files_intact, fsync_dir, makedirs, place, read_record, rmtree, safe_rel,
                     write_record_atomic)
from ._format import MARKER, STEP_DIR, disk_partial_name, marker_name, step_dir_name
from ._types import Checkpoint, StaleRoundError


def durable_path(d, step, flat):
    if not d:
        return ""
    return d if flat else os.path.join(d, step_dir_name(step))


def disk_partial(d, step, rank, pid):
    return os.path.join(d, disk_partial_name(step, rank, pid))


def begin_disk(d, step, rank, pid):
    makedirs(d)
    # One process writes a rank's checkpoints: another's partial is an earlier attempt's,
    # killed before its commit (no launch here to remove it).
    for name in os.listdir(d):
        if name.startswith(".partial-step-") and f"-rank-{rank}-" in name:
            rmtree(os.path.join(d, name))
    return disk_partial(d, step, rank, pid)


def commit_disk(partial, record, d):
    """Moves the files of `partial` into the durable layout, marker last, then retention."""
    step, rank = record["step"], record["rank"]
    durable = record["durable_path"]
    if not durable:
        rmtree(partial)
        return None
    if record["replicated"] and rank != 0:
        rmtree(partial)  # rank 0 writes the one copy on disk
        return Checkpoint(step, durable, "disk", rank)
    try:
        with fence(d, f"checkpoint step {step} of rank {rank}"):
            place_disk(partial, record, durable)
    except StaleRoundError:
        rmtree(partial)
        raise
    retention(d, rank, record["keep"])
    return Checkpoint(step, durable, "disk", rank)


def place_disk(partial, record, durable):
    step, rank = record["step"], record["rank"]
    makedirs(durable)
    marker = os.path.join(durable, marker_name(step, rank))
    try:
        os.unlink(marker)  # an earlier attempt's: the step is not on disk until the new one
        fsync_dir(durable)
    except FileNotFoundError:
        pass
    dirs = {durable}
    for f in record["files"]:
        dst = os.path.join(durable, f["path"])
        dirs.add(os.path.dirname(dst))
        makedirs(os.path.dirname(dst))
        place(os.path.join(partial, f["path"]), dst)
    for path in dirs:
        fsync_dir(path)
    write_record_atomic(marker, record)
    rmtree(partial)


def markers(d, rank):
    """{step: marker path} of `rank` in d (flat) and d/step-*/."""
    found = {}
    try:
        names = os.listdir(d)
    except FileNotFoundError:
        return found
    for name in names:
        m = MARKER.match(name)
        if m and int(m.group(2)) == rank:
            found.setdefault(int(m.group(1)), os.path.join(d, name))
        m = STEP_DIR.match(name)
        if m:
            path = os.path.join(d, name, f".ddpl-step-{m.group(1)}.rank-{rank}.json")
            if os.path.isfile(path):
                found[int(m.group(1))] = path
    return found


def retention(d, rank, keep):
    if keep <= 0:
        return
    found = markers(d, rank)
    steps = sorted(found, reverse=True)
    old = steps[keep:]
    if not old:
        return
    # A file a kept step lists stays (flat layouts may reuse a name).
    kept = set()
    for s in steps[:keep]:
        top = os.path.dirname(found[s])
        kept.update(os.path.join(top, f["path"]) for f in (read_record(found[s]) or {})
                    .get("files", []) if safe_rel(f.get("path")))
    for s in old:
        top = os.path.dirname(found[s])
        for f in (read_record(found[s]) or {}).get("files", []):
            path = os.path.join(top, f.get("path", ""))
            if safe_rel(f.get("path")) and path not in kept:
                try:
                    os.unlink(path)
                except FileNotFoundError:
                    pass
        try:
            os.unlink(found[s])
        except FileNotFoundError:
            pass
        if top != d:
            try:
                os.rmdir(top)  # the last rank to trim the step removes its directory
            except OSError:
                pass


def disk_steps(d, rank):
    """{step: directory} of the durable steps `rank` can read: its own, or rank 0's replicated
    ones."""
    found = {}
    for r in (rank, 0):
        for step, marker in markers(d, r).items():
            if step in found:
                continue
            record = read_record(marker)
            if (record and record.get("step") == step and record.get("rank") == r
                    and (r == rank or record.get("replicated") is True)
                    and isinstance(record.get("files"), list)
                    and files_intact(os.path.dirname(marker), record["files"])):
                found[step] = os.path.dirname(marker)
    return found
