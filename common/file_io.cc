#include "common/file_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>

#include <cerrno>
#include <cstring>
#include <exception>

#include "common/errors.h"

namespace ddpl {
namespace {

std::string directoryOf(const std::string& path) {
  const auto slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

[[noreturn]] void fail(const std::string& path, const std::string& step, const std::string& subject,
                       int error) {
  throw Error("cannot write " + path + ": " + step + " " + subject + ": " + std::strerror(error) +
              " (errno " + std::to_string(error) + ")");
}

// Closes and removes the temporary unless released: every way out of a failed write, including
// an exception from the producer, leaves nothing behind.
class TempFile {
 public:
  TempFile(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}
  ~TempFile() {
    if (fd_ >= 0) ::close(fd_);
    if (!path_.empty()) ::unlink(path_.c_str());
  }
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;
  int fd() const { return fd_; }
  const std::string& path() const { return path_; }
  // close(2) reports deferred write errors (NFS): it counts as part of the write.
  int close() {
    const int rc = ::close(fd_);
    fd_ = -1;
    return rc == 0 ? 0 : errno;
  }
  void release() { path_.clear(); }

 private:
  std::string path_;
  int fd_;
};

}  // namespace

int writeAll(int fd, const void* data, size_t size) noexcept {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t n = ::write(fd, p, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    if (n == 0) return ENOSPC;  // write(2) makes no progress only when the device is full
    p += n;
    size -= static_cast<size_t>(n);
  }
  return 0;
}

int pwriteAll(int fd, const void* data, size_t size, off_t offset) noexcept {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t n = ::pwrite(fd, p, size, offset);
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    if (n == 0) return ENOSPC;
    p += n;
    size -= static_cast<size_t>(n);
    offset += n;
  }
  return 0;
}

void ensurePrivateDirectory(const std::string& path) {
  if (::mkdir(path.c_str(), 0700) == 0) return;
  const int e = errno;
  if (e != EEXIST)
    throw Error("cannot create the directory " + path + ": " + std::strerror(e) + " (errno " +
                std::to_string(e) + ")");
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0)
    throw Error("cannot inspect " + path + ": " + std::strerror(errno));
  if (!S_ISDIR(st.st_mode))
    throw Error(path + " exists and is not a directory (a symlink or a file someone left there): "
                "refusing to write through it; remove it or choose another directory");
  if (st.st_uid != ::geteuid())
    throw Error(path + " belongs to uid " + std::to_string(st.st_uid) + ", not to this user (" +
                std::to_string(::geteuid()) + "): refusing to write into it");
  if ((st.st_mode & 077) != 0) {
    char mode[8];
    std::snprintf(mode, sizeof mode, "%03o", static_cast<unsigned>(st.st_mode & 0777));
    throw Error(path + " is open to other users (mode " + mode +
                "): refusing to write into it; chmod 700 it or remove it");
  }
}

std::string atomicWriteTempPath(const std::string& path) {
  return path + ".tmp." + std::to_string(::getpid());
}

void writeFileAtomically(const std::string& path,
                         const std::function<void(const FileSink&)>& produce,
                         const AtomicWriteOptions& options) {
  const std::string tmpPath = atomicWriteTempPath(path);
  // Created exclusively and never through a link: the temporary's name is predictable, and in
  // a shared directory (/tmp) another user could have planted a symlink there to make us
  // truncate a file of theirs choosing (issue 33). A leftover of ours (a crash, a reused pid)
  // or a planted entry is unlinked first (unlink removes a link, never its target; in a sticky
  // directory another user's entry cannot be, and the write fails instead).
  int fd = ::open(tmpPath.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC,
                  options.mode);
  if (fd < 0 && errno == EEXIST && ::unlink(tmpPath.c_str()) == 0)
    fd = ::open(tmpPath.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC,
                options.mode);
  if (fd < 0) fail(path, "create", tmpPath, errno);
  TempFile tmp(tmpPath, fd);
  produce([&](const void* data, size_t size) {
    if (const int e = writeAll(tmp.fd(), data, size)) fail(path, "write", tmpPath, e);
  });
  // Data on disk before the name points at it: otherwise a crash after the rename could leave a
  // complete-looking but empty file.
  if (options.durable && ::fsync(tmp.fd()) != 0) fail(path, "fsync", tmpPath, errno);
  if (const int e = tmp.close()) fail(path, "close", tmpPath, e);
  if (::rename(tmpPath.c_str(), path.c_str()) != 0)
    fail(path, "rename", tmpPath + " to " + path, errno);
  tmp.release();
  // Make the rename itself durable. The new file is in place already, so a directory that cannot
  // be opened (execute-only) or synced (some file systems) is not a failed write.
  if (!options.durable) return;
  const int dir = ::open(directoryOf(path).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir >= 0) {
    ::fsync(dir);
    ::close(dir);
  }
}

void writeFileAtomically(const std::string& path, std::string_view contents,
                         const AtomicWriteOptions& options) {
  writeFileAtomically(
      path, [&](const FileSink& sink) { sink(contents.data(), contents.size()); }, options);
}

}  // namespace ddpl
