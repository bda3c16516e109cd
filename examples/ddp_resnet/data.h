#pragma once
// The training and test images, held whole on the training device as uint8 (CIFAR-10 is 180 MB
// that way, a quarter of float), turned into normalised float batches on demand.
#include <ATen/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <string>

#include "examples/ddp_resnet/cifar10.h"

namespace ddpl::example {

struct Split {
  at::Tensor images;  // uint8 [N, 3, H, W]
  at::Tensor labels;  // int64 [N]
  int64_t size() const { return labels.size(0); }
};

struct Dataset {
  Split train;
  Split test;
  int64_t classes = 0;
  at::Tensor mean;  // float [3]: per-channel statistics of the training images, in 0..255
  at::Tensor std;
  bool augment = false;  // random crop (pad 4) and horizontal flip: natural images only
  std::string description;
};

struct SyntheticSpec {
  int64_t train_size = 0;
  int64_t test_size = 0;
  int64_t side = 32;
  int64_t classes = 10;
  uint64_t seed = 0;
};

// A learnable image-classification set generated deterministically from spec.seed (the same
// bytes on every rank and every run): each class is a pair of oriented colour gratings with its
// own frequencies; every image jitters those frequencies and angles, draws random phases and
// amplitudes, and adds two gratings of no class and pixel noise. Recognising a class means
// finding orientation, frequency and colour regardless of position: what early convolution
// layers learn.
Dataset makeSynthetic(const SyntheticSpec& spec);

Dataset fromCifar10(const Cifar10& data, bool augment);

// Moves the images to device (once, before training).
void moveTo(Dataset& data, const c10::Device& device);

struct Batch {
  at::Tensor images;  // float, normalised, on the dataset's device
  at::Tensor labels;
};

// indices: int64 on the dataset's device. With augmentSeed set (training on an augmenting
// set) each image gets a random crop and flip drawn from that seed, so reruns and resumed
// runs see the same batches.
Batch makeBatch(const Dataset& data, const Split& split, const at::Tensor& indices,
                bool channelsLast, const uint64_t* augmentSeed);

}  // namespace ddpl::example
