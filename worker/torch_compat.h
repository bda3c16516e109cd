#pragma once
// Where LibTorch's C++ API differs between the versions a user may build the worker library
// against (docs/compat.md: 2.9.1, pinned, to 2.15.0), the one place that bridges it. Every name
// here is taken from what the LibTorch being compiled declares, not from a version number, so
// that a new release that keeps an API needs no edit here.
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/variable.h>

#include <utility>

namespace ddpl::worker::torch_compat {

// A handle that keeps a parameter's gradient accumulator (an autograd Node) alive:
// std::shared_ptr<Node> up to torch 2.14, c10::intrusive_ptr<Node> from 2.15. The DDP reducer
// holds one per parameter to remove its post-hook at teardown.
using GradAccumulatorPtr =
    decltype(torch::autograd::impl::grad_accumulator(std::declval<const at::Tensor&>()));

}  // namespace ddpl::worker::torch_compat
