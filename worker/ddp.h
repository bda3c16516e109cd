#pragma once
// DistributedDataParallel for LibTorch (which has none: pytorch#48959). Gradients are bucketed
// in reverse registration order and each bucket's all-reduce is launched from autograd hooks as
// soon as its last gradient is ready, so communication overlaps the rest of backward; the end of
// backward waits for every bucket, so the optimizer step always sees averaged gradients.
#include <torch/nn/module.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/defaults.h"

namespace ddpl::worker {

inline constexpr size_t kDefaultFirstBucketBytes = size_t{1} << 20;   // small: starts comm early
inline constexpr size_t kDefaultBucketBytes = size_t{25} << 20;       // PyTorch's bucket_cap_mb

enum class CommHook {
  kNone,
  kFp16Compress,  // all-reduce gradients as float16, as torch's fp16_compress_hook
  kBf16Compress,  // ... as bfloat16
};

struct DdpOptions {
  // The first bucket (the last layers' gradients, ready first) is at most this, and at most half
  // of all gradients when they total under twice this (from 64 KiB up), so that a small model is
  // reduced in two parts and the first one overlaps the rest of backward.
  size_t first_bucket_bytes = kDefaultFirstBucketBytes;
  size_t bucket_bytes = kDefaultBucketBytes;
  // Every rank starts each forward with rank 0's buffers (BatchNorm statistics), as in PyTorch.
  bool broadcast_buffers = true;
  // true: rank 0's buffers leave as soon as a forward has finished (one collective for all of
  // them, overlapped with backward, as PyTorch's POST_FORWARD buffer hook) and are applied at
  // the next forward, so a step has one point where ranks wait for each other instead of two.
  // Buffers that rank 0 changes by hand between forwards then reach the others one forward
  // later. false: broadcast and wait before each forward (PyTorch's default).
  bool overlap_buffer_broadcast = true;
  // false: a parameter without a gradient in a synchronised backward is an error naming it.
  // true: its slot is reduced as zeros, so the ranks stay in step.
  bool find_unused_parameters = false;
  CommHook comm_hook = CommHook::kNone;
  // false: no collective at all (gradients stay local). Only for measuring overhead.
  bool communicate = true;
  std::chrono::milliseconds timeout{defaults::kCollectiveTimeout};
};

// What happened in the last synchronised backward, for tests and profiling.
struct BucketTrace {
  size_t num_params = 0;
  size_t bytes = 0;
  size_t grads_ready_at_launch = 0;  // of all parameters, how many had their gradient then
  double launched_us = -1;           // since the first gradient of this backward
};
struct IterationTrace {
  size_t num_grads = 0;
  double last_grad_ready_us = -1;
  double finished_us = -1;  // all buckets reduced and gradients written back
  std::vector<BucketTrace> buckets;
};

// The type-independent part: bucketing, hooks, collectives.
//
// Threading: one training thread calls forward/backward and the methods here. The gradient hooks
// run on autograd's threads (the caller's for CPU, the device threads for CUDA) and launch
// collectives from there; they share state with the training thread under one mutex. The end of
// each synchronised backward (an autograd final callback) waits for every bucket with
// DdpOptions::timeout, so backward() returns only with averaged gradients or an exception.
// Destroy the reducer on the training thread, after the last backward.
class DdpReducer {
 public:
  DdpReducer(std::shared_ptr<torch::nn::Module> module, c10::intrusive_ptr<c10d::Backend> backend,
             DdpOptions options = {});
  ~DdpReducer();
  DdpReducer(const DdpReducer&) = delete;
  DdpReducer& operator=(const DdpReducer&) = delete;

  // Around each forward (DistributedDataParallel::forward calls them): after beforeForward
  // every rank holds rank 0's buffers; afterForward sends rank 0's updated ones on their way.
  void beforeForward();
  void afterForward();

  void setRequireGradSync(bool sync);
  bool requireGradSync() const;

  // For recovering from an error inside one micro-batch (AutoBatch, worker/auto_batch.h). Every
  // rank must issue the same collectives in the same order; a rank whose forward or backward
  // threw has issued only some of a micro-batch's. forwardsBegun() counts beforeForward calls.
  uint64_t forwardsBegun() const;
  // Issues and waits for the collectives the other ranks issue for the rest of the micro-batch
  // begun after forwardsBegun() was `begunBefore`: the buffer broadcast of its forward and, when
  // `sync`, every bucket's all-reduce not yet launched (as zeros). Called with the current
  // forwardsBegun(), it stands in for a whole micro-batch this rank skips. The gradients of the
  // step are meaningless afterwards, on every rank: discard them.
  void completeAbandonedPass(uint64_t begunBefore, bool sync);

  IterationTrace lastIteration() const;
  // Parameter names per bucket, bucket 0 first (reverse registration order).
  std::vector<std::vector<std::string>> bucketLayout() const;
  const DdpOptions& options() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Disables gradient synchronisation while alive (gradient accumulation); the first backward
// after it synchronises the accumulated gradients.
class NoSyncGuard {
 public:
  explicit NoSyncGuard(DdpReducer& reducer) : reducer_(&reducer), previous_(reducer.requireGradSync()) {
    reducer_->setRequireGradSync(false);
  }
  ~NoSyncGuard() { reducer_->setRequireGradSync(previous_); }
  NoSyncGuard(const NoSyncGuard&) = delete;
  NoSyncGuard& operator=(const NoSyncGuard&) = delete;

 private:
  DdpReducer* reducer_;
  bool previous_;
};

template <typename ModuleType>
class DistributedDataParallel {
 public:
  DistributedDataParallel(std::shared_ptr<ModuleType> module,
                          c10::intrusive_ptr<c10d::Backend> backend, DdpOptions options = {})
      : module_(std::move(module)), reducer_(module_, std::move(backend), std::move(options)) {}

  template <typename... Args>
  decltype(auto) forward(Args&&... args) {
    reducer_.beforeForward();
    decltype(auto) out = module_->forward(std::forward<Args>(args)...);
    reducer_.afterForward();
    return out;
  }
  template <typename... Args>
  decltype(auto) operator()(Args&&... args) {
    return forward(std::forward<Args>(args)...);
  }

  NoSyncGuard noSync() { return NoSyncGuard(reducer_); }

  ModuleType* operator->() { return module_.get(); }
  const std::shared_ptr<ModuleType>& module() const { return module_; }
  DdpReducer& reducer() { return reducer_; }

 private:
  std::shared_ptr<ModuleType> module_;
  DdpReducer reducer_;
};

}  // namespace ddpl::worker
