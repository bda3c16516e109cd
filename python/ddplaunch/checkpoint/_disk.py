"""The durable layout (docs/checkpoints.md): <dir>/step-<N>/ (or <dir> itself, flat) with each
rank's marker written last, what the module writes there itself without launch, durable
retention, and the steps a rank can read back. The C++ side of the same is
common/checkpoint_files.h (persistStep, listDurable, retireDurable)."""
import os

from ._fence import fence
from ._files import (entries, files_present, fsync_dir, is_real_dir, makedirs, place,
                     read_record, rmtree, write_record)
from ._format import (disk_partial_name, marker_name, parse_marker_name, parse_step_dir_name,
                      step_dir_name, steps_to_retire)
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
    write_record(marker, record, durable=True)
    rmtree(partial)


class Marker:
    """A marker file's place: step and rank by its name, the directory its step's files are in."""
    __slots__ = ("step", "rank", "dir", "path")

    def __init__(self, step, rank, dir, path):
        self.step, self.rank, self.dir, self.path = step, rank, dir, path


def markers_under(d):
    """The markers in d (flat) and in each d/step-<N>/ (step N's only), any rank."""
    out = []

    def scan(top, only_step):
        for name, _ in entries(top):
            m = parse_marker_name(name)
            if m is not None and only_step in (None, m[0]):
                out.append(Marker(m[0], m[1], top, os.path.join(top, name)))

    scan(d, None)
    for name, st in entries(d):
        step = parse_step_dir_name(name)
        if step is not None and is_real_dir(st):
            scan(os.path.join(d, name), step)
    return out


def read_marker(m):
    """The marker's record when it is one and matches its name, else None."""
    record = read_record(m.path)
    if record is None or record["step"] != m.step or record["rank"] != m.rank:
        return None
    return record


def retention(d, rank, keep):
    """Removes the markers and then the files of `rank`'s persisted steps beyond the newest
    `keep` (0: keeps all); a file that a kept step of the rank lists stays (flat layouts may
    reuse a name). Returns how many markers went."""
    if keep <= 0 or not d:
        return 0
    mine = [m for m in markers_under(d) if m.rank == rank]
    doomed = set(steps_to_retire([m.step for m in mine], keep))
    if not doomed:
        return 0
    kept = set()
    for m in mine:
        record = read_marker(m) if m.step not in doomed else None
        if record is not None:
            kept.update(os.path.join(m.dir, f["path"]) for f in record["files"])
    removed = 0
    for m in mine:
        if m.step not in doomed:
            continue
        record = read_marker(m)
        try:
            os.unlink(m.path)  # first: a step whose files are being removed is never offered
        except FileNotFoundError:
            pass
        except OSError:
            continue
        for f in record["files"] if record is not None else ():
            path = os.path.join(m.dir, f["path"])
            if path not in kept:
                try:
                    os.unlink(path)
                except OSError:
                    pass
        if m.dir != d:
            try:
                os.rmdir(m.dir)  # only when empty: other ranks' files stay
            except OSError:
                pass
        removed += 1
    return removed


def disk_steps(d, rank):
    """{step: directory} of the durable steps `rank` can read (common/checkpoint_files.h
    listDurable): a marker of its own, else rank 0's of a replicated step, whose files are
    there with their sizes. A step's own directory before the flat one."""
    found = {}
    candidates = [m for m in markers_under(d) if m.rank in (rank, 0)]
    candidates.sort(key=lambda m: (m.rank != rank, m.dir == d))
    for m in candidates:
        if m.step in found:
            continue
        record = read_marker(m)
        if (record is not None and (m.rank == rank or record["replicated"])
                and files_present(m.dir, record["files"])):
            found[m.step] = m.dir
    return found
