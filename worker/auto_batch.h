#pragma once
// Recovery from device out-of-memory errors without losing the run: when a step's forward or
// backward runs out of memory on any rank, every rank abandons that step together, switches to a
// smaller micro-batch with proportionally more gradient accumulation, and runs the step again.
// The global batch (micro-batch x accumulation x world size), the data each step sees and so the
// optimiser's trajectory stay what they were; one log line says so.
//
// How ranks stay together: the rank that failed issues the collectives the others issue for the
// rest of the step (DdpReducer::completeAbandonedPass), so no rank waits in a collective for it;
// then one small all-reduce per step tells every rank whether any rank failed. That all-reduce
// is the whole cost when nothing fails (one scalar per optimizer step).
//
// Caveats, by design: BatchNorm computes its batch statistics over the micro-batch, so with
// BatchNorm a smaller micro-batch is a (slightly) different computation, as it would be had the
// run been started with it. Running statistics and other module buffers are restored to their
// state at the start of the abandoned step.
#include <torch/nn/module.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "worker/ddp.h"

namespace ddpl::worker {

class Session;

struct MicroBatching {
  int64_t micro_batch = 1;   // samples per forward on each rank
  int64_t accumulation = 1;  // forwards per optimizer step
};

// The next smaller micro-batching with the same samples per step: the micro-batch divided by
// its smallest prime factor (8 -> 4, 6 -> 3, 9 -> 3, 7 -> 1), accumulation multiplied by it.
// Returns false when the micro-batch is already 1 or would fall below `min_micro_batch`.
bool shrinkMicroBatching(const MicroBatching& from, int64_t min_micro_batch, MicroBatching& to);

// A fault-injection point for tests: raises the same c10::OutOfMemoryError a device allocator
// raises, once per process.
struct OomInjection {
  int64_t step = -1;       // optimizer step index (as passed to AutoBatch::step); -1: never
  int rank = 0;            // on this rank only; -1: every rank
  int64_t micro = -1;      // micro-batch index within the step; -1: the last (the synchronised one)
  bool in_backward = true;  // true: from a gradient hook midway through backward (some buckets
                            // already launched); false: just before the micro-batch's forward
};

struct AutoBatchOptions {
  // false: step() runs the micro-batches as plain gradient accumulation, with no all-reduce of
  // its own, and an out-of-memory error propagates.
  bool enabled = true;
  int64_t min_micro_batch = 1;
  OomInjection inject;
};

// One instance per training loop, used from the training thread only.
class AutoBatch {
 public:
  AutoBatch(Session& session, DdpReducer& reducer, torch::nn::Module& module, MicroBatching initial,
            AutoBatchOptions options = {});
  template <typename M>
  AutoBatch(Session& session, DistributedDataParallel<M>& ddp, MicroBatching initial,
            AutoBatchOptions options = {})
      : AutoBatch(session, ddp.reducer(), *ddp.module(), initial, std::move(options)) {}

  const MicroBatching& current() const { return current_; }
  int switches() const { return switches_; }

  // Runs the micro-batches of optimizer step `step`: microStep(m) runs forward and backward of
  // micro-batch m (0 <= m < current().accumulation) through the DistributedDataParallel, its
  // loss divided by current().accumulation, reading current() for the micro-batch size. All but
  // the last run without gradient synchronisation.
  // Returns true when the gradients are averaged and ready for the optimizer. Returns false when
  // some rank ran out of memory: the step's gradients are gone (set to undefined), buffers are
  // back where the step started, current() is smaller on every rank; run the same step again.
  // Throws ddpl::Error when the micro-batch cannot shrink any further.
  bool step(int64_t step, const std::function<void(int64_t micro)>& microStep);

 private:
  void runMicro(int64_t step, int64_t micro, bool sync,
                const std::function<void(int64_t)>& microStep);

  Session& session_;
  DdpReducer& reducer_;
  torch::nn::Module& module_;
  MicroBatching current_;
  AutoBatchOptions options_;
  int switches_ = 0;
  bool injected_ = false;
};

}  // namespace ddpl::worker
