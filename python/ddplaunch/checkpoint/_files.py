"""File operations the tiers share: no symlink followed where it matters, new files created
exclusively and private, durable writes fsynced."""
import errno
import json
import os
import shutil
import stat

from ._format import RECORD, VERSION, encode_record  # noqa: F401  (RECORD: callers' name)

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


def write_new(path, data):
    fd = os.open(path, NEW_FILE, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)


def write_record_atomic(path, record):
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        os.unlink(tmp)  # a leftover of this pid's earlier, killed life
    except FileNotFoundError:
        pass
    write_new(tmp, encode_record(record))
    os.rename(tmp, path)
    fsync_dir(os.path.dirname(path))


def list_files(top):
    """[{"path", "size"}] of the regular files under top; anything else is refused."""
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
            files.append({"path": rel, "size": st.st_size})
    files.sort(key=lambda f: f["path"])
    return files


def tree_bytes(top):
    total = 0
    for dirpath, _, filenames in os.walk(top):
        for name in filenames:
            try:
                st = os.lstat(os.path.join(dirpath, name))
            except FileNotFoundError:
                continue
            if stat.S_ISREG(st.st_mode):
                total += st.st_size
    return total


def safe_rel(rel):
    return (isinstance(rel, str) and rel and not rel.startswith("/")
            and ".." not in rel.split("/"))


def files_intact(top, files):
    try:
        for f in files:
            if not safe_rel(f["path"]):
                return False
            st = os.lstat(os.path.join(top, f["path"]))
            if not stat.S_ISREG(st.st_mode) or st.st_size != f["size"]:
                return False
        return True
    except (OSError, KeyError, TypeError):
        return False


def read_record(path):
    try:
        with open(path, "rb") as f:
            record = json.load(f)
        return record if isinstance(record, dict) and record.get("version") == VERSION else None
    except (OSError, ValueError):
        return None


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
