#pragma once
// As torch.utils.data.DistributedSampler: disjoint shards per rank, reshuffled each epoch from
// a shared seed (same generator and algorithm, so the same indices as Python for a given seed),
// padded by wrapping around or trimmed with drop_last.
#include <cstdint>
#include <vector>

namespace ddpl::worker {

struct SamplerOptions {
  bool shuffle = true;
  uint64_t seed = 0;
  bool drop_last = false;
};

class DistributedSampler {
 public:
  DistributedSampler(int64_t datasetSize, int rank, int worldSize, SamplerOptions options = {});

  void setEpoch(int64_t epoch) { epoch_ = epoch; }
  int64_t epoch() const { return epoch_; }
  // This rank's indices for the current epoch, numSamples() of them.
  std::vector<int64_t> indices() const;
  int64_t numSamples() const { return num_samples_; }
  int64_t totalSize() const { return total_size_; }

 private:
  int64_t dataset_size_;
  int rank_;
  int world_size_;
  SamplerOptions options_;
  int64_t epoch_ = 0;
  int64_t num_samples_;
  int64_t total_size_;
};

}  // namespace ddpl::worker
