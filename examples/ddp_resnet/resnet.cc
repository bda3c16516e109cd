#include "examples/ddp_resnet/resnet.h"

#include <torch/torch.h>

#include <array>

namespace ddpl::example {
namespace {

namespace nn = torch::nn;

constexpr int64_t kBottleneckExpansion = 4;

nn::Conv2d conv(int64_t in, int64_t out, int64_t kernel, int64_t stride) {
  return nn::Conv2d(
      nn::Conv2dOptions(in, out, kernel).stride(stride).padding(kernel / 2).bias(false));
}

std::array<int64_t, 4> blocksPerStage(ModelKind model) {
  switch (model) {
    case ModelKind::kResNet18:
      return {2, 2, 2, 2};
    case ModelKind::kResNet34:
    case ModelKind::kResNet50:
      return {3, 4, 6, 3};
  }
  return {2, 2, 2, 2};
}

}  // namespace

ResidualBlockImpl::ResidualBlockImpl(int64_t inChannels, int64_t planes, int64_t stride,
                                     bool bottleneck) {
  nn::Sequential branch;
  nn::BatchNorm2d lastBn{nullptr};
  if (bottleneck) {
    out_channels_ = planes * kBottleneckExpansion;
    lastBn = nn::BatchNorm2d(out_channels_);
    branch->push_back("conv1", conv(inChannels, planes, 1, 1));
    branch->push_back("bn1", nn::BatchNorm2d(planes));
    branch->push_back("relu1", nn::ReLU(nn::ReLUOptions().inplace(true)));
    // Stride on the 3x3, as torchvision ("ResNet v1.5"): slightly more accurate than on the 1x1.
    branch->push_back("conv2", conv(planes, planes, 3, stride));
    branch->push_back("bn2", nn::BatchNorm2d(planes));
    branch->push_back("relu2", nn::ReLU(nn::ReLUOptions().inplace(true)));
    branch->push_back("conv3", conv(planes, out_channels_, 1, 1));
    branch->push_back("bn3", lastBn);
  } else {
    out_channels_ = planes;
    lastBn = nn::BatchNorm2d(planes);
    branch->push_back("conv1", conv(inChannels, planes, 3, stride));
    branch->push_back("bn1", nn::BatchNorm2d(planes));
    branch->push_back("relu1", nn::ReLU(nn::ReLUOptions().inplace(true)));
    branch->push_back("conv2", conv(planes, planes, 3, 1));
    branch->push_back("bn2", lastBn);
  }
  // Each block starts as the identity (Goyal et al. 2017): large-batch SGD with a high learning
  // rate then trains stably from the first step.
  nn::init::zeros_(lastBn->weight);
  branch_ = register_module("branch", branch);
  if (stride != 1 || inChannels != out_channels_) {
    nn::Sequential shortcut;
    shortcut->push_back("conv", conv(inChannels, out_channels_, 1, stride));
    shortcut->push_back("bn", nn::BatchNorm2d(out_channels_));
    shortcut_ = register_module("shortcut", shortcut);
  }
}

torch::Tensor ResidualBlockImpl::forward(const torch::Tensor& x) {
  auto identity = shortcut_ ? shortcut_->forward(x) : x;
  return torch::relu(branch_->forward(x) + identity);
}

ResNetImpl::ResNetImpl(const ResNetConfig& config) {
  const int64_t w = config.width;
  nn::Sequential stem;
  if (config.imagenet_stem) {
    stem->push_back("conv", conv(3, w, 7, 2));
    stem->push_back("bn", nn::BatchNorm2d(w));
    stem->push_back("relu", nn::ReLU(nn::ReLUOptions().inplace(true)));
    stem->push_back("pool", nn::MaxPool2d(nn::MaxPool2dOptions(3).stride(2).padding(1)));
  } else {
    stem->push_back("conv", conv(3, w, 3, 1));
    stem->push_back("bn", nn::BatchNorm2d(w));
    stem->push_back("relu", nn::ReLU(nn::ReLUOptions().inplace(true)));
  }
  stem_ = register_module("stem", stem);

  const bool bottleneck = config.model == ModelKind::kResNet50;
  const auto counts = blocksPerStage(config.model);
  int64_t channels = w;
  for (size_t s = 0; s < counts.size(); ++s) {
    nn::Sequential stage;
    const int64_t planes = w << s;
    for (int64_t b = 0; b < counts[s]; ++b) {
      const int64_t stride = (s > 0 && b == 0) ? 2 : 1;
      ResidualBlock block(channels, planes, stride, bottleneck);
      channels = block->outChannels();
      stage->push_back("block" + std::to_string(b), block);
    }
    stages_.push_back(register_module("stage" + std::to_string(s + 1), stage));
  }
  fc_ = register_module("fc", nn::Linear(channels, config.classes));

  for (auto& module : modules(/*include_self=*/false)) {
    if (auto* c = module->as<nn::Conv2d>()) {
      nn::init::kaiming_normal_(c->weight, 0.0, torch::kFanOut, torch::kReLU);
    }
  }
}

torch::Tensor ResNetImpl::forward(const torch::Tensor& x) {
  auto h = stem_->forward(x);
  for (auto& stage : stages_) h = stage->forward(h);
  h = torch::adaptive_avg_pool2d(h, {1, 1}).flatten(1);
  return fc_->forward(h);
}

}  // namespace ddpl::example
