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
  bool previousEnabled_;
  c10::ScalarType previousDtype_;
};

struct GradScalerOptions {
  double initScale = 65536.0;
  double growthFactor = 2.0;
  double backoffFactor = 0.5;
  int64_t growthInterval = 2000;
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
  // Backs off on overflow, grows after growthInterval clean steps.
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
    at::Tensor foundInf;
  };

  GradScalerOptions options_;
  c10::intrusive_ptr<c10d::Backend> backend_;
  at::Tensor scale_;          // float32, one element, on the loss's device
  at::Tensor growthTracker_;  // int32, one element
  std::map<const torch::optim::Optimizer*, OptimizerState> perOptimizer_;
  // Restored from a checkpoint before the first scale(): applied at lazyInit.
  std::optional<double> pendingScale_;
  std::optional<int64_t> pendingTracker_;
};

struct PerformanceOptions {
  std::optional<bool> cudnnBenchmark;
  std::optional<bool> deterministic;  // deterministic algorithms (and cuDNN)
  std::optional<std::string> float32MatmulPrecision;  // "highest", "high" (TF32), "medium"
  std::optional<bool> allowTf32Cudnn;
};

void applyPerformanceOptions(const PerformanceOptions& options);

}  // namespace ddpl::worker
