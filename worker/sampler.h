#pragma once
// As torch.utils.data.DistributedSampler: disjoint shards per rank, reshuffled each epoch from
// a shared seed (same generator and algorithm, so the same indices as Python for a given seed),
// padded by wrapping around or trimmed with dropLast.
#include <cstdint>
#include <vector>

namespace ddpl::worker {

struct SamplerOptions {
  bool shuffle = true;
  uint64_t seed = 0;
  bool dropLast = false;
};

class DistributedSampler {
 public:
  DistributedSampler(int64_t datasetSize, int rank, int worldSize, SamplerOptions options = {});

  void setEpoch(int64_t epoch) { epoch_ = epoch; }
  int64_t epoch() const { return epoch_; }
  // This rank's indices for the current epoch, numSamples() of them.
  std::vector<int64_t> indices() const;
  int64_t numSamples() const { return numSamples_; }
  int64_t totalSize() const { return totalSize_; }

 private:
  int64_t datasetSize_;
  int rank_;
  int worldSize_;
  SamplerOptions options_;
  int64_t epoch_ = 0;
  int64_t numSamples_;
  int64_t totalSize_;
};

}  // namespace ddpl::worker
