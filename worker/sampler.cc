#include "worker/sampler.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <string>

#include "common/errors.h"

namespace ddpl::worker {

DistributedSampler::DistributedSampler(int64_t datasetSize, int rank, int worldSize, SamplerOptions options)
    : datasetSize_(datasetSize), rank_(rank), worldSize_(worldSize), options_(options) {
  if (worldSize < 1 || rank < 0 || rank >= worldSize) {
    throw InvalidArgument("DistributedSampler: rank " + std::to_string(rank) + " outside [0, " +
                          std::to_string(worldSize) + ")");
  }
  if (datasetSize < 0) throw InvalidArgument("DistributedSampler: negative dataset size");
  // torch.utils.data.DistributedSampler's arithmetic, so shards match Python's exactly.
  if (options_.dropLast && datasetSize_ % worldSize_ != 0) {
    // ceil((n - w) / w), as Python's math.ceil
    numSamples_ = datasetSize_ < worldSize_ ? 0 : (datasetSize_ - worldSize_ + worldSize_ - 1) / worldSize_;
  } else {
    numSamples_ = (datasetSize_ + worldSize_ - 1) / worldSize_;
  }
  totalSize_ = numSamples_ * worldSize_;
}

std::vector<int64_t> DistributedSampler::indices() const {
  std::vector<int64_t> all;
  all.reserve(static_cast<size_t>(std::max(totalSize_, datasetSize_)));
  if (options_.shuffle) {
    // Same generator and seed as Python: torch.Generator().manual_seed(seed + epoch).
    auto generator = at::make_generator<at::CPUGeneratorImpl>(options_.seed + static_cast<uint64_t>(epoch_));
    const at::Tensor perm = at::randperm(datasetSize_, generator, at::TensorOptions().dtype(at::kLong));
    const int64_t* data = perm.data_ptr<int64_t>();
    all.assign(data, data + datasetSize_);
  } else {
    for (int64_t i = 0; i < datasetSize_; ++i) all.push_back(i);
  }
  if (!options_.dropLast) {
    // Pad by repeating from the start (several times over if the dataset is tiny).
    const int64_t padding = totalSize_ - static_cast<int64_t>(all.size());
    for (int64_t i = 0; i < padding && datasetSize_ > 0; ++i) all.push_back(all[static_cast<size_t>(i % datasetSize_)]);
  } else {
    all.resize(static_cast<size_t>(totalSize_));
  }
  std::vector<int64_t> mine;
  mine.reserve(static_cast<size_t>(numSamples_));
  for (int64_t i = rank_; i < totalSize_; i += worldSize_) mine.push_back(all[static_cast<size_t>(i)]);
  return mine;
}

}  // namespace ddpl::worker
