#pragma once
// The benchmark's small ResNet (same layers as bench/ddp_bench.py's): CIFAR-sized input,
// a stem, two residual stages, global pooling, a classifier.
#include <torch/torch.h>

namespace ddpl::bench {

struct BasicBlockImpl : torch::nn::Module {
  BasicBlockImpl(int64_t in, int64_t out, int64_t stride) {
    conv1 = register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(in, out, 3).stride(stride).padding(1).bias(false)));
    bn1 = register_module("bn1", torch::nn::BatchNorm2d(out));
    conv2 = register_module("conv2", torch::nn::Conv2d(torch::nn::Conv2dOptions(out, out, 3).padding(1).bias(false)));
    bn2 = register_module("bn2", torch::nn::BatchNorm2d(out));
    if (stride != 1 || in != out) {
      shortcut = register_module("shortcut", torch::nn::Sequential(
          torch::nn::Conv2d(torch::nn::Conv2dOptions(in, out, 1).stride(stride).bias(false)), torch::nn::BatchNorm2d(out)));
    }
  }
  torch::Tensor forward(const torch::Tensor& x) {
    auto out = torch::relu(bn1(conv1(x)));
    out = bn2(conv2(out));
    return torch::relu(out + (shortcut ? shortcut->forward(x) : x));
  }
  torch::nn::Conv2d conv1{nullptr}, conv2{nullptr};
  torch::nn::BatchNorm2d bn1{nullptr}, bn2{nullptr};
  torch::nn::Sequential shortcut{nullptr};
};
TORCH_MODULE(BasicBlock);

struct SmallResNetImpl : torch::nn::Module {
  SmallResNetImpl() {
    stem = register_module("stem", torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 16, 3).padding(1).bias(false)));
    bn = register_module("bn", torch::nn::BatchNorm2d(16));
    layer1 = register_module("layer1", torch::nn::Sequential(BasicBlock(16, 16, 1), BasicBlock(16, 16, 1)));
    layer2 = register_module("layer2", torch::nn::Sequential(BasicBlock(16, 32, 2), BasicBlock(32, 32, 1)));
    layer3 = register_module("layer3", torch::nn::Sequential(BasicBlock(32, 64, 2), BasicBlock(64, 64, 1)));
    fc = register_module("fc", torch::nn::Linear(64, 10));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    auto out = torch::relu(bn(stem(x)));
    out = layer3->forward(layer2->forward(layer1->forward(out)));
    out = torch::adaptive_avg_pool2d(out, {1, 1}).flatten(1);
    return fc(out);
  }
  torch::nn::Conv2d stem{nullptr};
  torch::nn::BatchNorm2d bn{nullptr};
  torch::nn::Sequential layer1{nullptr}, layer2{nullptr}, layer3{nullptr};
  torch::nn::Linear fc{nullptr};
};
TORCH_MODULE(SmallResNet);

}  // namespace ddpl::bench
