#include "worker/checkpoint_archive.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <torch/torch.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common/errors.h"
#include "common/file_io.h"
#include "worker/amp.h"
#include "worker/log_bridge.h"
#include "worker/session.h"

namespace ddpl::worker {
namespace {

constexpr int64_t kFormatVersion = 1;

[[noreturn]] void fail(const std::string& what, const std::string& path) {
  throw Error("checkpoint " + path + ": " + what + ": " + std::strerror(errno));
}

}  // namespace

void saveCheckpoint(const std::string& path, const CheckpointRefs& parts) {
  saveCheckpoint(path, parts, SaveLimits{});
}

void saveCheckpoint(const std::string& path, const CheckpointRefs& parts,
                    const SaveLimits& limits) {
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
    archive.write("progress/samples_seen", c10::IValue(parts.progress->samples_seen));
  }

  // The archive's writer is called from inside miniz (C code): an exception must not cross it.
  // Nor may it report a short write: LibTorch's zip writer then fails in its destructor, which
  // terminates the process (seen with a full disk, LibTorch 2.9). So the first failed write is
  // kept, the rest of the archive is accepted and dropped, and the error is thrown here, where
  // writeFileAtomically removes the temporary.
  std::exception_ptr writeError;
  uint64_t written = 0;
  writeFileAtomically(path, [&](const FileSink& sink) {
    archive.save_to([&](const void* data, size_t size) -> size_t {
      if (writeError) return size;
      try {
        // Stopped as soon as it is over: a state larger than memory allows never fills it.
        if (written + size > limits.max_bytes)
          throw CheckpointTooLarge(path + ": over " + std::to_string(limits.max_bytes) +
                                       " bytes after " + std::to_string(written + size),
                                   written + size);
        written += size;
        sink(data, size);
      } catch (...) {
        writeError = std::current_exception();
      }
      return size;
    });
    if (writeError) std::rethrow_exception(writeError);
  });
  if (limits.log) wlog::info("checkpoint written: " + path);
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
    parts.progress->samples_seen = v.toInt();
  }
  return true;
}

}  // namespace ddpl::worker
