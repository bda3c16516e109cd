#include "worker/checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <torch/torch.h>

#include <cerrno>
#include <cstring>

#include "common/errors.h"
#include "worker/log_bridge.h"
#include "worker/amp.h"
#include "worker/session.h"

namespace ddpl::worker {
namespace {

constexpr int64_t kFormatVersion = 1;

std::string directoryOf(const std::string& path) {
  const auto slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

[[noreturn]] void fail(const std::string& what, const std::string& path) {
  throw Error("checkpoint " + path + ": " + what + ": " + std::strerror(errno));
}

}  // namespace

void saveCheckpoint(const std::string& path, const CheckpointRefs& parts) {
  if (parts.model == nullptr) throw InvalidArgument("saveCheckpoint: no model");
  torch::serialize::OutputArchive archive;
  archive.write("format_version", c10::IValue(kFormatVersion));
  torch::serialize::OutputArchive model;
  parts.model->save(model);
  archive.write("model", model);
  if (parts.optimizer) {
    torch::serialize::OutputArchive optimizer;
    parts.optimizer->save(optimizer);
    archive.write("optimizer", optimizer);
  }
  if (parts.scaler) {
    torch::serialize::OutputArchive scaler;
    parts.scaler->save(scaler);
    archive.write("scaler", scaler);
  }
  if (parts.progress) {
    archive.write("progress/epoch", c10::IValue(parts.progress->epoch));
    archive.write("progress/step", c10::IValue(parts.progress->step));
    archive.write("progress/samples_seen", c10::IValue(parts.progress->samplesSeen));
  }

  // Same directory as the target, so rename() is atomic; unique per process so two writers
  // never share a temporary.
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail("cannot create " + tmp, path);
  bool ok = true;
  int savedErrno = 0;
  try {
    archive.save_to([&](const void* data, size_t size) -> size_t {
      const char* p = static_cast<const char*>(data);
      size_t done = 0;
      while (done < size) {
        const ssize_t n = ::write(fd, p + done, size - done);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
          ok = false;
          savedErrno = errno;
          return done;
        }
        done += static_cast<size_t>(n);
      }
      return done;
    });
  } catch (...) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  // Data on disk before the name points at it: otherwise a crash after rename could leave a
  // complete-looking but empty file.
  if (ok && ::fsync(fd) != 0) { ok = false; savedErrno = errno; }
  ::close(fd);
  if (!ok) {
    ::unlink(tmp.c_str());
    errno = savedErrno;
    fail("writing " + tmp, path);
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = errno;
    ::unlink(tmp.c_str());
    errno = e;
    fail("rename", path);
  }
  // Make the rename itself durable.
  const int dir = ::open(directoryOf(path).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir >= 0) {
    ::fsync(dir);
    ::close(dir);
  }
  wlog::info("checkpoint written: " + path);
}

void saveCheckpoint(Session& session, const std::string& path, const CheckpointRefs& parts) {
  std::exception_ptr error;
  if (session.rank() == 0) {
    try {
      saveCheckpoint(path, parts);
    } catch (...) {
      error = std::current_exception();
    }
  }
  // Every rank waits, so nobody loads (or exits) before rank 0 has finished writing.
  session.barrier();
  if (error) std::rethrow_exception(error);
}

bool loadCheckpoint(const std::string& path, const CheckpointRefs& parts) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return false;
    fail("stat", path);
  }
  if (parts.model == nullptr) throw InvalidArgument("loadCheckpoint: no model");
  torch::serialize::InputArchive archive;
  try {
    archive.load_from(path);
  } catch (const std::exception& e) {
    throw Error("checkpoint " + path + " is unreadable: " + e.what());
  }
  c10::IValue version;
  archive.read("format_version", version);
  if (version.toInt() != kFormatVersion) {
    throw Error("checkpoint " + path + " has format version " + std::to_string(version.toInt()) +
                ", expected " + std::to_string(kFormatVersion));
  }
  torch::serialize::InputArchive model;
  archive.read("model", model);
  parts.model->load(model);
  if (parts.optimizer) {
    torch::serialize::InputArchive optimizer;
    archive.read("optimizer", optimizer);
    parts.optimizer->load(optimizer);
  }
  if (parts.scaler) {
    torch::serialize::InputArchive scaler;
    archive.read("scaler", scaler);
    parts.scaler->load(scaler);
  }
  if (parts.progress) {
    c10::IValue v;
    archive.read("progress/epoch", v);
    parts.progress->epoch = v.toInt();
    archive.read("progress/step", v);
    parts.progress->step = v.toInt();
    archive.read("progress/samples_seen", v);
    parts.progress->samplesSeen = v.toInt();
  }
  return true;
}

}  // namespace ddpl::worker
