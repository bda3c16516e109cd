#pragma once
// Writing files so that a reader never sees half of one: the one helper behind checkpoints,
// error files, the run manifest and port files. Plain std:: in this header (the worker library
// includes it next to LibTorch's bundled fmt).
#include <sys/types.h>

#include <cstddef>
#include <functional>
#include <string>
#include <string_view>

namespace ddpl {

// write(2) until all `size` bytes are out, retrying on EINTR (and on a short write). Returns 0,
// or the errno of the write that failed (ENOSPC when write returned 0). Allocates nothing and
// takes no lock, so a forked child of a threaded process and a terminate handler may call it.
int writeAll(int fd, const void* data, size_t size) noexcept;

// The same at an offset, with pwrite(2) (the file offset is left alone).
int pwriteAll(int fd, const void* data, size_t size, off_t offset) noexcept;

// Feeds bytes to the file being written; throws ddpl::Error (path and errno in the message) when
// a write fails, so a producer may stop early.
using FileSink = std::function<void(const void* data, size_t size)>;

struct AtomicWriteOptions {
  mode_t mode = 0644;  // subject to the umask
  // fsync the file before the rename and the directory after it, so that the new contents
  // survive a machine crash. Off only for files that are cheap to lose but must never be read
  // half-written, where a sync would sit on a latency path (launch's run manifest, port files).
  bool durable = true;
};

// Replaces `path` as one step: the bytes go to "<path>.tmp.<pid>" in the same directory (rename
// is atomic only within one file system), are fsync'ed, the temporary is renamed over `path`,
// and the directory is fsync'ed so that the rename survives a crash. Readers see the old file
// or the new one, never a mixture; after a crash at most a stale "<path>.tmp.<pid>" is left.
//
// On any failure the temporary is removed and ddpl::Error names the step, the path and errno
// ("cannot write /x/ckpt.pt: create /x/ckpt.pt.tmp.42: Permission denied (errno 13)");
// an exception thrown by `produce` also removes it and propagates unchanged. One writer per path
// per process at a time (the temporary's name is per process). A directory that cannot be
// synced after the rename is not a failure: the new file is in place by then.
void writeFileAtomically(const std::string& path,
                         const std::function<void(const FileSink&)>& produce,
                         const AtomicWriteOptions& options = {});
void writeFileAtomically(const std::string& path, std::string_view contents,
                         const AtomicWriteOptions& options = {});

// A directory that only this user can enter, at a name others may know in advance (a shared
// /tmp): made with mode 0700, or, when it exists, accepted only if it is a real directory (not
// a symlink) owned by this user and closed to group and others. Throws ddpl::Error saying which
// of these fails, so that nothing is ever written into a directory someone else planted.
void ensurePrivateDirectory(const std::string& path);

// The temporary writeFileAtomically uses for `path` in this process.
std::string atomicWriteTempPath(const std::string& path);

}  // namespace ddpl
