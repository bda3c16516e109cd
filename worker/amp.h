#pragma once
// Mixed precision for LibTorch, which has autocast but no GradScaler: an RAII autocast scope,
// a GradScaler with PyTorch's dynamic loss scaling (same kernels, same state machine) whose
// inf/NaN verdict is agreed across ranks, and the global performance switches.
#include <ATen/Tensor.h>
#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/optim/optimizer.h>
#include <torch/serialize/archive.h>

#include <map>
#include <optional>
#include <string>

namespace ddpl::worker {

// As `with torch.autocast(device_type, dtype)`: nests, restores the previous state on exit and
// drops the cast cache when the outermost scope ends.
class AutocastScope {
 public:
  // dtype defaults to float16 on CUDA and bfloat16 on CPU, as torch.autocast does.
  explicit AutocastScope(c10::DeviceType device, std::optional<c10::ScalarType> dtype = std::nullopt,
                         bool enabled = true);
  ~AutocastScope();
  AutocastScope(const AutocastScope&) = delete;
  AutocastScope& operator=(const AutocastScope&) = delete;

 private:
  c10::DeviceType device_;
  bool previous_enabled_;
  c10::ScalarType previous_dtype_;
};

struct GradScalerOptions {
  double init_scale = 65536.0;
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 2000;
  bool enabled = true;
};

class GradScaler {
 public:
  // backend: when given, found-inf is all-reduced (MAX) so every rank skips the same steps.
  explicit GradScaler(GradScalerOptions options = {},
                      c10::intrusive_ptr<c10d::Backend> backend = {});

  at::Tensor scale(const at::Tensor& loss);
  // Divides the optimizer's gradients by the scale in place, recording inf/NaN. At most once
  // per optimizer between updates.
  void unscale(torch::optim::Optimizer& optimizer);
  // Steps unless a gradient was inf/NaN (on any rank). Returns whether it stepped.
  bool step(torch::optim::Optimizer& optimizer);
  // Backs off on overflow, grows after growth_interval clean steps.
  void update();

  double currentScale() const;
  int64_t growthTracker() const;
  bool enabled() const { return options_.enabled; }

  void save(torch::serialize::OutputArchive& archive) const;
  void load(torch::serialize::InputArchive& archive);

 private:
  void lazyInit(const at::Device& device);

  struct OptimizerState {
    bool unscaled = false;
    bool stepped = false;
    at::Tensor found_inf;
  };

  GradScalerOptions options_;
  c10::intrusive_ptr<c10d::Backend> backend_;
  at::Tensor scale_;          // float32, one element, on the loss's device
  at::Tensor growth_tracker_;  // int32, one element
  std::map<const torch::optim::Optimizer*, OptimizerState> per_optimizer_;
  // Restored from a checkpoint before the first scale(): applied at lazyInit.
  std::optional<double> pending_scale_;
  std::optional<int64_t> pending_tracker_;
};

struct PerformanceOptions {
  std::optional<bool> cudnn_benchmark;
  std::optional<bool> deterministic;  // deterministic algorithms (and cuDNN)
  std::optional<std::string> float32_matmul_precision;  // "highest", "high" (TF32), "medium"
  std::optional<bool> allow_tf32_cudnn;
};

void applyPerformanceOptions(const PerformanceOptions& options);

}  // namespace ddpl::worker
