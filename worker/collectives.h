#pragma once
// Internal: small integer agreements between ranks (a decision, a step, a failure flag), one
// collective for all the values given. Not installed.
#include <torch/torch.h>

#include <cstdint>
#include <vector>

#include "worker/session.h"

namespace ddpl::worker::detail {

inline std::vector<int64_t> allReduceInts(Session& session, const std::vector<int64_t>& values,
                                          c10d::ReduceOp op) {
  std::vector<at::Tensor> t{
      torch::tensor(values, torch::TensorOptions().dtype(torch::kLong).device(session.device()))};
  c10d::AllreduceOptions opts;
  opts.reduceOp = op;
  opts.timeout = session.options().collective_timeout;
  session.backend()->allreduce(t, opts)->wait(opts.timeout);
  const at::Tensor cpu = t[0].cpu();
  return {cpu.data_ptr<int64_t>(), cpu.data_ptr<int64_t>() + cpu.numel()};
}

}  // namespace ddpl::worker::detail
