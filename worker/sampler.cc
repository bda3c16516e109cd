#include "worker/sampler.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <string>

#include "common/errors.h"

namespace ddpl::worker {

DistributedSampler::DistributedSampler(int64_t datasetSize, int rank, int worldSize,
                                       SamplerOptions options)
    : dataset_size_(datasetSize), rank_(rank), world_size_(worldSize), options_(options) {
  if (worldSize < 1 || rank < 0 || rank >= worldSize) {
    throw InvalidArgument("DistributedSampler: rank " + std::to_string(rank) + " outside [0, " +
                          std::to_string(worldSize) + ")");
  }
  if (datasetSize < 0) throw InvalidArgument("DistributedSampler: negative dataset size");
  // torch.utils.data.DistributedSampler's arithmetic, so shards match Python's exactly.
  if (options_.drop_last && dataset_size_ % world_size_ != 0) {
    // ceil((n - w) / w), as Python's math.ceil
    num_samples_ = dataset_size_ < world_size_
                       ? 0
                       : (dataset_size_ - world_size_ + world_size_ - 1) / world_size_;
  } else {
    num_samples_ = (dataset_size_ + world_size_ - 1) / world_size_;
  }
  total_size_ = num_samples_ * world_size_;
}

std::vector<int64_t> DistributedSampler::indices() const {
  std::vector<int64_t> all;
  all.reserve(static_cast<size_t>(std::max(total_size_, dataset_size_)));
  if (options_.shuffle) {
    // Same generator and seed as Python: torch.Generator().manual_seed(seed + epoch).
    auto generator = at::make_generator<at::CPUGeneratorImpl>(options_.seed + static_cast<uint64_t>(epoch_));
    const at::Tensor perm =
        at::randperm(dataset_size_, generator, at::TensorOptions().dtype(at::kLong));
    const int64_t* data = perm.data_ptr<int64_t>();
    all.assign(data, data + dataset_size_);
  } else {
    for (int64_t i = 0; i < dataset_size_; ++i) all.push_back(i);
  }
  if (!options_.drop_last) {
    // Pad by repeating from the start (several times over if the dataset is tiny).
    const int64_t padding = total_size_ - static_cast<int64_t>(all.size());
    for (int64_t i = 0; i < padding && dataset_size_ > 0; ++i)
      all.push_back(all[static_cast<size_t>(i % dataset_size_)]);
  } else {
    all.resize(static_cast<size_t>(total_size_));
  }
  std::vector<int64_t> mine;
  mine.reserve(static_cast<size_t>(num_samples_));
  for (int64_t i = rank_; i < total_size_; i += world_size_)
    mine.push_back(all[static_cast<size_t>(i)]);
  return mine;
}

}  // namespace ddpl::worker
