#pragma once
// Internal: creation of LibTorch's process-group backends. Kept in one TU so that the Gloo and
// NCCL/CUDA headers never reach the public headers.
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <string>

namespace ddpl::worker::detail {

struct BackendSpec {
  c10::intrusive_ptr<c10d::Store> store;
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  std::chrono::milliseconds timeout{};
  std::string gloo_interface;
};

c10::intrusive_ptr<c10d::Backend> makeGlooBackend(const BackendSpec& spec);

// Binds cuda:local_rank and creates ProcessGroupNCCL (its async error handling comes from the
// environment; see SessionOptions::fromEnvironment). Throws
// BackendError when this build or machine has no NCCL/CUDA.
c10::intrusive_ptr<c10d::Backend> makeNcclBackend(const BackendSpec& spec);

bool ncclCompiledIn();
bool cudaAvailable();

}  // namespace ddpl::worker::detail
