"""File operations the tiers share (the C++ side: common/checkpoint_files.h): no symlink
followed, new files created exclusively and private, durable writes fsynced, and a committed
step read back as common/checkpoint_files.h's readCommitted reads it."""
import errno
import os
import shutil
import stat

from ._format import MAX_FILES, MAX_RECORD_BYTES, RECORD, RecordError, decode_record, encode_record

NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def rmtree(path):
    shutil.rmtree(path, ignore_errors=True)


def fsync_dir(path):
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def makedirs(path):
    os.makedirs(path, mode=0o700, exist_ok=True)


def entries(d):
    """(name, lstat) of what is in d; nothing when d cannot be listed. An entry that vanishes
    meanwhile is left out."""
    try:
        names = os.listdir(d)
    except OSError:
        return []
    out = []
    for name in names:
        try:
            out.append((name, os.lstat(os.path.join(d, name))))
        except OSError:
            continue
    return out


def is_real_dir(st):
    return stat.S_ISDIR(st.st_mode)  # from lstat: a symlink to a directory is not one


def write_new(path, data, sync=True):
    fd = os.open(path, NEW_FILE, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path, data, durable):
    """`path` replaced in one step: the bytes go to "<path>.tmp-<pid>" first (exclusive, 0600),
    then a rename; durable: fsynced, and the directory after the rename."""
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        os.unlink(tmp)  # a leftover of this pid's earlier, killed life
    except FileNotFoundError:
        pass
    write_new(tmp, data, sync=durable)
    os.rename(tmp, path)
    if durable:
        fsync_dir(os.path.dirname(path))


def write_record(path, record, durable):
    write_atomic(path, encode_record(record), durable)


def list_files(top):
    """[{"path", "size"}] of the regular files under top, by path (byte order), the record
    itself excluded; anything but a regular file or a directory is refused, and more than
    MAX_FILES files."""
    files = []
    for dirpath, dirnames, filenames in os.walk(top):
        for name in dirnames + filenames:
            full = os.path.join(dirpath, name)
            st = os.lstat(full)
            rel = os.path.relpath(full, top)
            if stat.S_ISDIR(st.st_mode):
                continue
            if not stat.S_ISREG(st.st_mode):
                raise ValueError(f"checkpoint file {rel!r} in {top} is not a regular file "
                                 "(symlinks and special files are refused): write the data "
                                 "itself under the directory begin() returned")
            if rel == RECORD:
                continue
            if len(files) >= MAX_FILES:
                raise ValueError(f"cannot commit {top}: more than {MAX_FILES} files")
            files.append({"path": rel, "size": st.st_size})
    files.sort(key=lambda f: f["path"].encode())
    return files


def tree_bytes(top):
    """Bytes of the regular files under top (no symlink followed)."""
    total = 0
    for name, st in entries(top):
        if stat.S_ISDIR(st.st_mode):
            total += tree_bytes(os.path.join(top, name))
        elif stat.S_ISREG(st.st_mode):
            total += st.st_size
    return total


def read_small(path, limit):
    """The bytes of `path`, a regular file (not through a symlink) of at most `limit` bytes;
    raises OSError (or RecordError for a size or type that does not fit)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > limit:
            raise RecordError(f"{path}: not a regular file of at most {limit} bytes")
        data = b""
        while len(data) < st.st_size:
            chunk = os.pread(fd, st.st_size - len(data), len(data))
            if not chunk:
                raise RecordError(f"{path}: short read")
            data += chunk
        return data
    finally:
        os.close(fd)


def read_record(path):
    """The decoded record at `path`, or None (unreadable, or not a record)."""
    try:
        return decode_record(read_small(path, MAX_RECORD_BYTES))
    except (OSError, RecordError):
        return None


def files_present(top, files):
    """Every listed file a regular file (not through a symlink) of its size."""
    for f in files:
        try:
            st = os.lstat(os.path.join(top, f["path"]))
        except OSError:
            return False
        if not stat.S_ISREG(st.st_mode) or st.st_size != f["size"]:
            return False
    return True


def read_committed(step_dir, step, rank):
    """The record of `step_dir` when it is a valid committed step of `rank`: the record parses,
    matches the names, and every listed file is there with its size; else None."""
    record = read_record(os.path.join(step_dir, RECORD))
    if record is None or record["step"] != step or record["rank"] != rank:
        return None
    return record if files_present(step_dir, record["files"]) else None


def place(src, dst):
    """src's file at dst, durably: rename within a filesystem, else copy under a temporary
    name and rename, so dst is never seen half written."""
    fd = os.open(src, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        try:
            os.fsync(fd)
            os.rename(src, dst)
            return
        except OSError as e:
            if e.errno != errno.EXDEV:
                raise
        tmp = os.path.join(os.path.dirname(dst), f".{os.path.basename(dst)}.tmp-{os.getpid()}")
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        out = os.open(tmp, NEW_FILE, 0o600)
        try:
            size, offset = os.fstat(fd).st_size, 0
            while offset < size:
                sent = os.sendfile(out, fd, offset, size - offset)
                if sent == 0:
                    raise OSError(errno.EIO, f"{src} shrank while copied to {dst}")
                offset += sent
            os.fsync(out)
        finally:
            os.close(out)
        os.rename(tmp, dst)
    finally:
        os.close(fd)
