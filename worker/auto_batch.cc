#include "worker/auto_batch.h"

#include <torch/torch.h>

#include <optional>

#include "common/errors.h"
#include "worker/build_config.h"
#include "worker/collectives.h"
#include "worker/log_bridge.h"
#include "worker/session.h"

#if DDPL_WORKER_NCCL
#include <c10/cuda/CUDACachingAllocator.h>
#endif

namespace ddpl::worker {
namespace {

std::string firstLine(const std::string& s) { return s.substr(0, s.find('\n')); }

std::string describe(const MicroBatching& m) {
  return std::to_string(m.micro_batch) + " x " + std::to_string(m.accumulation) + " accumulated";
}

[[noreturn]] void throwInjected(int64_t step, int rank) {
  throw c10::OutOfMemoryError({__func__, __FILE__, static_cast<uint32_t>(__LINE__)},
                              "out of memory (injected by AutoBatchOptions::inject at step " +
                                  std::to_string(step) + " on rank " + std::to_string(rank) + ")");
}

}  // namespace

bool shrinkMicroBatching(const MicroBatching& from, int64_t min_micro_batch, MicroBatching& to) {
  if (from.micro_batch <= 1) return false;
  int64_t factor = from.micro_batch;
  for (int64_t f = 2; f * f <= from.micro_batch; ++f) {
    if (from.micro_batch % f == 0) {
      factor = f;
      break;
    }
  }
  const int64_t next = from.micro_batch / factor;
  if (next < std::max<int64_t>(1, min_micro_batch)) return false;
  to = {next, from.accumulation * factor};
  return true;
}

AutoBatch::AutoBatch(Session& session, DdpReducer& reducer, torch::nn::Module& module,
                     MicroBatching initial, AutoBatchOptions options)
    : session_(session),
      reducer_(reducer),
      module_(module),
      current_(initial),
      options_(std::move(options)) {
  if (initial.micro_batch < 1 || initial.accumulation < 1) {
    throw InvalidArgument("AutoBatch: micro-batch " + std::to_string(initial.micro_batch) +
                          " and accumulation " + std::to_string(initial.accumulation) +
                          " must both be at least 1");
  }
}

void AutoBatch::runMicro(int64_t step, int64_t micro, bool sync,
                         const std::function<void(int64_t)>& microStep) {
  const OomInjection& inj = options_.inject;
  const bool inject = !injected_ && inj.step == step &&
                      (inj.rank < 0 || inj.rank == session_.rank()) &&
                      (inj.micro < 0 ? sync : inj.micro == micro);
  if (!inject) {
    microStep(micro);
    return;
  }
  injected_ = true;
  if (!inj.in_backward) throwInjected(step, session_.rank());
  // The middle parameter in registration order: buckets go in reverse registration order, so
  // with several buckets the first ones are already launched when its gradient arrives.
  std::vector<at::Tensor> params;
  for (const auto& p : module_.parameters()) {
    if (p.requires_grad()) params.push_back(p);
  }
  if (params.empty()) throwInjected(step, session_.rank());
  at::Tensor target = params[params.size() / 2];
  const int rank = session_.rank();
  const auto handle =
      target.register_hook([step, rank](const at::Tensor&) { throwInjected(step, rank); });
  try {
    microStep(micro);
  } catch (...) {
    target.remove_hook(handle);
    throw;
  }
  target.remove_hook(handle);
}

bool AutoBatch::step(int64_t step, const std::function<void(int64_t micro)>& microStep) {
  const int64_t accumulation = current_.accumulation;
  if (!options_.enabled) {
    for (int64_t m = 0; m < accumulation; ++m) {
      std::optional<NoSyncGuard> noSync;
      if (m + 1 < accumulation) noSync.emplace(reducer_);
      microStep(m);
    }
    return true;
  }

  std::vector<at::Tensor> buffers, saved;
  {
    torch::NoGradGuard noGrad;
    for (const auto& b : module_.buffers()) {
      buffers.push_back(b);
      saved.push_back(b.clone());
    }
  }
  bool failed = false;
  std::string what;
  for (int64_t m = 0; m < accumulation; ++m) {
    const bool sync = m + 1 == accumulation;
    std::optional<NoSyncGuard> noSync;
    if (!sync) noSync.emplace(reducer_);
    if (failed) {  // the rest of the step, without compute, for the collectives' sake
      reducer_.completeAbandonedPass(reducer_.forwardsBegun(), sync);
      continue;
    }
    const uint64_t before = reducer_.forwardsBegun();
    try {
      runMicro(step, m, sync, microStep);
    } catch (const c10::OutOfMemoryError& e) {
      failed = true;
      what = firstLine(e.what());
      reducer_.completeAbandonedPass(before, sync);
    }
  }
  const int64_t failures =
      detail::allReduceInts(session_, {failed ? 1 : 0}, c10d::ReduceOp::SUM)[0];
  if (failures == 0) return true;

  const int world = session_.worldSize();
  const int64_t firstRank = -detail::allReduceInts(session_, {failed ? -session_.rank() : -world},
                                                   c10d::ReduceOp::MAX)[0];
  {
    torch::NoGradGuard noGrad;
    for (auto& p : module_.parameters()) p.mutable_grad().reset();
    for (size_t i = 0; i < buffers.size(); ++i) buffers[i].copy_(saved[i]);
  }
#if DDPL_WORKER_NCCL
  if (session_.device().is_cuda()) c10::cuda::CUDACachingAllocator::emptyCache();
#endif
  const std::string where =
      "rank " + std::to_string(firstRank) +
      (failures > 1 ? " and " + std::to_string(failures - 1) + " other(s)" : "") +
      " ran out of device memory at step " + std::to_string(step) + " with micro-batch " +
      describe(current_);
  MicroBatching next;
  if (!shrinkMicroBatching(current_, options_.min_micro_batch, next)) {
    throw Error(where + ", and the micro-batch cannot be smaller (minimum " +
                std::to_string(std::max<int64_t>(1, options_.min_micro_batch)) +
                "): the model itself does not fit; use a smaller model, activation "
                "checkpointing, bf16, or more devices" +
                (failed ? " (" + what + ")" : ""));
  }
  if (session_.rank() == 0) {
    wlog::warn(where + ": every rank continues with micro-batch " + describe(next) +
               ", global batch " + std::to_string(next.micro_batch * next.accumulation * world) +
               " unchanged; step " + std::to_string(step) + " runs again");
  }
  current_ = next;
  ++switches_;
  return false;
}

}  // namespace ddpl::worker
