#include "worker/backends.h"

#include "worker/build_config.h"

#if DDPL_WORKER_NCCL
#define USE_C10D_NCCL
#include <c10/cuda/CUDAFunctions.h>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/cuda.h>

#include "common/errors.h"

namespace ddpl::worker::detail {

c10::intrusive_ptr<c10d::Backend> makeGlooBackend(const BackendSpec& spec) {
  auto options = c10d::ProcessGroupGloo::Options::create(spec.timeout);
  options->devices.push_back(
      spec.gloo_interface.empty()
          ? c10d::ProcessGroupGloo::createDefaultDevice()
          : c10d::ProcessGroupGloo::createDeviceForInterface(spec.gloo_interface));
  // Two threads, as torch.distributed does: one bucket's all-reduce can proceed while the next
  // is queued.
  options->threads = 2;
  return c10::make_intrusive<c10d::ProcessGroupGloo>(spec.store, spec.rank, spec.world_size,
                                                     options);
}

bool ncclCompiledIn() { return DDPL_WORKER_NCCL != 0; }

bool cudaAvailable() { return torch::cuda::is_available(); }

c10::intrusive_ptr<c10d::Backend> makeNcclBackend(const BackendSpec& spec) {
#if DDPL_WORKER_NCCL
  const int devices = static_cast<int>(torch::cuda::device_count());
  if (devices == 0) throw BackendError("NCCL backend requested but no CUDA device is visible");
  if (spec.local_rank >= devices) {
    // NCCL refuses two ranks on one GPU ("Duplicate GPU detected"); say so before it does.
    throw BackendError("NCCL: LOCAL_RANK " + std::to_string(spec.local_rank) + " but only " +
                       std::to_string(devices) + " CUDA device(s) visible; one rank per GPU");
  }
  c10::cuda::set_device(static_cast<c10::DeviceIndex>(spec.local_rank));
  auto options = c10d::ProcessGroupNCCL::Options::create();
  options->timeout = spec.timeout;
  // Async error handling (TORCH_NCCL_ASYNC_ERROR_HANDLING) is read by ProcessGroupNCCL from the
  // environment only; SessionOptions::fromEnvironment() puts its default there, in main, before
  // any thread starts. Nothing here touches the environment.
  return c10::make_intrusive<c10d::ProcessGroupNCCL>(spec.store, spec.rank, spec.world_size,
                                                     options);
#else
  (void)spec;
  throw BackendError("NCCL backend requested but this build has no NCCL support");
#endif
}

}  // namespace ddpl::worker::detail
