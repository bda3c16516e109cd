#pragma once
// One checkpoint file: a LibTorch archive of the model, and optionally the optimizer, the grad
// scaler and the training progress (worker/checkpoint_manager.h decides where such files go and
// which one a start resumes from). Written atomically (temporary file in the same directory,
// fsync, rename, fsync of the directory), so a process killed mid-write never replaces the last
// good checkpoint.
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <cstdint>
#include <string>

#include "common/errors.h"

namespace ddpl::worker {

class GradScaler;
class Session;

struct TrainingProgress {
  int64_t epoch = 0;
  int64_t step = 0;
  int64_t samples_seen = 0;
};

struct CheckpointRefs {
  torch::nn::Module* model = nullptr;
  torch::optim::Optimizer* optimizer = nullptr;  // optional
  GradScaler* scaler = nullptr;                  // optional
  TrainingProgress* progress = nullptr;          // optional
};

// Writes from this process, atomically. Throws ddpl::Error naming the path on failure and leaves
// no temporary file behind.
void saveCheckpoint(const std::string& path, const CheckpointRefs& parts);

// A write that would pass SaveLimits::max_bytes: stopped there, nothing left behind.
class CheckpointTooLarge : public Error {
 public:
  CheckpointTooLarge(const std::string& what, uint64_t bytes) : Error(what), bytes_(bytes) {}
  uint64_t bytesSoFar() const { return bytes_; }

 private:
  uint64_t bytes_;
};

struct SaveLimits {
  uint64_t max_bytes = UINT64_MAX;  // throws CheckpointTooLarge past it
  bool log = true;                 // the "checkpoint written" line
};
void saveCheckpoint(const std::string& path, const CheckpointRefs& parts, const SaveLimits& limits);

// Rank 0 writes, then all ranks meet at a barrier, so every rank can load it afterwards.
void saveCheckpoint(Session& session, const std::string& path, const CheckpointRefs& parts);

// Returns false when there is no checkpoint at path (first start); throws if it is unreadable.
bool loadCheckpoint(const std::string& path, const CheckpointRefs& parts);

}  // namespace ddpl::worker
