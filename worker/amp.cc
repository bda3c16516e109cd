#include "worker/amp.h"

#include <ATen/autocast_mode.h>
#include <torch/torch.h>

#include "common/errors.h"

namespace ddpl::worker {

AutocastScope::AutocastScope(c10::DeviceType device, std::optional<c10::ScalarType> dtype,
                             bool enabled)
    : device_(device),
      previous_enabled_(at::autocast::is_autocast_enabled(device)),
      previous_dtype_(at::autocast::get_autocast_dtype(device)) {
  const c10::ScalarType chosen = dtype.value_or(device == c10::kCUDA ? at::kHalf : at::kBFloat16);
  at::autocast::set_autocast_enabled(device_, enabled);
  at::autocast::set_autocast_dtype(device_, chosen);
  at::autocast::increment_nesting();
}

AutocastScope::~AutocastScope() {
  // The cast cache is only valid inside the outermost region (torch.autocast.__exit__).
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  at::autocast::set_autocast_enabled(device_, previous_enabled_);
  at::autocast::set_autocast_dtype(device_, previous_dtype_);
}

GradScaler::GradScaler(GradScalerOptions options, c10::intrusive_ptr<c10d::Backend> backend)
    : options_(options), backend_(std::move(backend)) {
  if (options_.growth_factor <= 1.0) throw InvalidArgument("GradScaler: growth_factor must be > 1");
  if (options_.backoff_factor >= 1.0 || options_.backoff_factor <= 0.0) {
    throw InvalidArgument("GradScaler: backoff_factor must be in (0, 1)");
  }
  if (options_.growth_interval < 1)
    throw InvalidArgument("GradScaler: growth_interval must be >= 1");
}

void GradScaler::lazyInit(const at::Device& device) {
  if (scale_.defined()) return;
  auto f32 = at::TensorOptions().dtype(at::kFloat).device(device);
  scale_ = at::full({1}, pending_scale_.value_or(options_.init_scale), f32);
  growth_tracker_ = at::full({1}, pending_tracker_.value_or(0), f32.dtype(at::kInt));
}

at::Tensor GradScaler::scale(const at::Tensor& loss) {
  if (!options_.enabled) return loss;
  lazyInit(loss.device());
  return loss * scale_.to(loss.device(), /*non_blocking=*/true).squeeze();
}

void GradScaler::unscale(torch::optim::Optimizer& optimizer) {
  if (!options_.enabled) return;
  OptimizerState& state = per_optimizer_[&optimizer];
  if (state.unscaled) {
    throw InvalidArgument("GradScaler::unscale() has already been called on this optimizer since the last update()");
  }
  if (state.stepped) throw InvalidArgument("GradScaler::unscale() is being called after step()");
  if (!scale_.defined()) throw InvalidArgument("GradScaler::unscale() called before scale()");
  torch::NoGradGuard noGrad;
  // As torch.amp.GradScaler: reciprocal in double, then float.
  const at::Tensor invScale = scale_.to(at::kDouble).reciprocal().to(at::kFloat);
  state.found_inf = at::zeros({1}, scale_.options());
  std::map<std::pair<std::string, c10::ScalarType>, std::vector<at::Tensor>> grads;
  for (auto& group : optimizer.param_groups()) {
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      if (p.grad().scalar_type() == at::kHalf) {
        throw InvalidArgument("GradScaler: attempting to unscale FP16 gradients (keep master weights in FP32)");
      }
      grads[{p.grad().device().str(), p.grad().scalar_type()}].push_back(p.mutable_grad());
    }
  }
  for (auto& [key, list] : grads) {
    const c10::Device device(key.first);
    at::Tensor foundOnDevice = state.found_inf.to(device);
    at::_amp_foreach_non_finite_check_and_unscale_(list, foundOnDevice, invScale.to(device));
    if (!foundOnDevice.is_same(state.found_inf))
      state.found_inf.copy_(foundOnDevice.to(state.found_inf.device()));
  }
  if (backend_ && backend_->getSize() > 1) {
    // One rank's overflow skips the step everywhere, or the replicas drift apart.
    std::vector<at::Tensor> tensors{state.found_inf};
    c10d::AllreduceOptions opts;
    opts.reduceOp = c10d::ReduceOp::MAX;
    backend_->allreduce(tensors, opts)->wait();
  }
  state.unscaled = true;
}

bool GradScaler::step(torch::optim::Optimizer& optimizer) {
  if (!options_.enabled) {
    optimizer.step();
    return true;
  }
  OptimizerState& state = per_optimizer_[&optimizer];
  if (state.stepped) throw InvalidArgument("GradScaler::step() has already been called since the last update()");
  if (!state.unscaled) unscale(optimizer);
  const bool overflow = state.found_inf.item<float>() != 0.0f;
  state.stepped = true;
  if (overflow) return false;
  optimizer.step();
  return true;
}

void GradScaler::update() {
  if (!options_.enabled || !scale_.defined()) return;
  at::Tensor found = at::zeros({1}, scale_.options());
  bool any = false;
  for (auto& [opt, state] : per_optimizer_) {
    if (!state.found_inf.defined()) continue;
    found.add_(state.found_inf.to(found.device()));
    any = true;
  }
  if (!any) throw InvalidArgument("GradScaler::update(): no inf checks were recorded prior to update");
  at::_amp_update_scale_(scale_, growth_tracker_, found, options_.growth_factor,
                         options_.backoff_factor, options_.growth_interval);
  per_optimizer_.clear();
}

double GradScaler::currentScale() const {
  if (!scale_.defined()) return pending_scale_.value_or(options_.init_scale);
  return scale_.item<float>();
}

int64_t GradScaler::growthTracker() const {
  if (!growth_tracker_.defined()) return pending_tracker_.value_or(0);
  return growth_tracker_.item<int>();
}

void GradScaler::save(torch::serialize::OutputArchive& archive) const {
  archive.write("scale", c10::IValue(currentScale()));
  archive.write("growth_tracker", c10::IValue(growthTracker()));
}

void GradScaler::load(torch::serialize::InputArchive& archive) {
  c10::IValue scale, tracker;
  archive.read("scale", scale);
  archive.read("growth_tracker", tracker);
  pending_scale_ = scale.toDouble();
  pending_tracker_ = tracker.toInt();
  if (scale_.defined()) {
    scale_.fill_(*pending_scale_);
    growth_tracker_.fill_(*pending_tracker_);
  }
}

void applyPerformanceOptions(const PerformanceOptions& options) {
  auto& context = at::globalContext();
  if (options.cudnn_benchmark) context.setBenchmarkCuDNN(*options.cudnn_benchmark);
  if (options.deterministic) {
    context.setDeterministicAlgorithms(*options.deterministic, /*warn_only=*/false);
    context.setDeterministicCuDNN(*options.deterministic);
  }
  if (options.float32_matmul_precision)
    context.setFloat32MatmulPrecision(*options.float32_matmul_precision);
  if (options.allow_tf32_cudnn) context.setAllowTF32CuDNN(*options.allow_tf32_cudnn);
}

}  // namespace ddpl::worker
