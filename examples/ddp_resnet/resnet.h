#pragma once
// ResNet-18/34/50 (He et al. 2015) in LibTorch, laid out as torchvision's: basic blocks for 18
// and 34, bottleneck blocks (expansion 4) for 50. Two stems: a 3x3 convolution for 32x32
// images (CIFAR; the 7x7/2 stem and max-pool would shrink them to 8x8 before the first stage)
// and the ImageNet 7x7/2 convolution plus 3x3/2 max-pool for 224x224.
#include <torch/nn/module.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>

#include <cstdint>
#include <vector>

#include "examples/ddp_resnet/options.h"

namespace ddpl::example {

struct ResNetConfig {
  ModelKind model = ModelKind::kResNet18;
  int64_t width = 64;  // channels of the first stage; later stages double it
  int64_t classes = 10;
  bool imagenet_stem = false;
};

class ResidualBlockImpl : public torch::nn::Module {
 public:
  ResidualBlockImpl(int64_t inChannels, int64_t planes, int64_t stride, bool bottleneck);
  torch::Tensor forward(const torch::Tensor& x);
  int64_t outChannels() const { return out_channels_; }

 private:
  torch::nn::Sequential branch_{nullptr};
  torch::nn::Sequential shortcut_{nullptr};  // null: identity
  int64_t out_channels_;
};
TORCH_MODULE(ResidualBlock);

class ResNetImpl : public torch::nn::Module {
 public:
  explicit ResNetImpl(const ResNetConfig& config);
  torch::Tensor forward(const torch::Tensor& x);

 private:
  torch::nn::Sequential stem_{nullptr};
  std::vector<torch::nn::Sequential> stages_;  // registered as stage1..stage4
  torch::nn::Linear fc_{nullptr};
};
TORCH_MODULE(ResNet);

}  // namespace ddpl::example
