#include "examples/ddp_resnet/data.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <cmath>

namespace ddpl::example {
namespace {

using torch::indexing::None;
using torch::indexing::Slice;

// Images processed at once: 1024 of 32x32, fewer of larger ones, so that the float temporaries
// stay near 100 MB whatever the image size.
constexpr int64_t kChunkPixels = 1024 * 32 * 32;
int64_t chunkFor(int64_t side) { return std::max<int64_t>(1, kChunkPixels / (side * side)); }
constexpr int64_t kGratingsPerClass = 2;
constexpr double kPi = 3.14159265358979323846;
// Difficulty, tuned so that the demo's narrow ResNet-18 needs a few epochs to pass 80%: without
// per-image jitter and distractors it reached 99% within two, which shows no learning curve.
// The jitter also makes neighbouring classes overlap, so 100% is out of reach.
constexpr double kNoise = 1.2;                // pixel noise, in units of a grating's amplitude
constexpr double kDistractorAmplitude = 1.2;  // up to this much of a class grating
constexpr int64_t kDistractors = 2;
constexpr double kAngleJitter = 0.5;       // radians, uniform +-
constexpr double kFrequencyJitter = 0.35;  // relative, uniform +-
constexpr double kContrast = 0.16;
constexpr int64_t kCropPadding = 4;

at::Generator generator(uint64_t seed) { return at::make_generator<at::CPUGeneratorImpl>(seed); }

// One independent stream per purpose from one user seed (splitmix64's finaliser).
uint64_t mix(uint64_t seed, uint64_t salt) {
  uint64_t z = seed + 0x9E3779B97F4A7C15ULL * (salt + 1);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

struct ClassPatterns {
  at::Tensor frequency;  // [C, K] cycles per image
  at::Tensor angle;      // [C, K] radians
  at::Tensor colour;     // [C, K, 3]
};

ClassPatterns drawClasses(int64_t classes, uint64_t seed) {
  auto g = generator(mix(seed, 0));
  ClassPatterns p;
  p.frequency = 1.0 + 3.0 * torch::rand({classes, kGratingsPerClass}, g);
  p.angle = kPi * torch::rand({classes, kGratingsPerClass}, g);
  p.colour = 2.0 * torch::rand({classes, kGratingsPerClass, 3}, g) - 1.0;
  return p;
}

// sin(2*pi*f*(x cos(a) + y sin(a)) + phase) on the unit square; f, a, phase: [B, K] -> [B, K, S,
// S].
at::Tensor gratings(const at::Tensor& f, const at::Tensor& a, const at::Tensor& phase,
                    const at::Tensor& coords) {
  const auto x = coords.view({1, 1, 1, -1});
  const auto y = coords.view({1, 1, -1, 1});
  const auto b = [](const at::Tensor& t) { return t.unsqueeze(-1).unsqueeze(-1); };
  return torch::sin(2 * kPi * b(f) * (x * b(torch::cos(a)) + y * b(torch::sin(a))) + b(phase));
}

Split generateSplit(const ClassPatterns& classes, int64_t n, int64_t side, uint64_t seed) {
  const int64_t numClasses = classes.frequency.size(0);
  auto g = generator(seed);
  // Balanced classes in a random order.
  Split split;
  split.labels =
      torch::arange(n, torch::kLong).remainder(numClasses).index_select(0, torch::randperm(n, g));
  split.images = torch::empty({n, 3, side, side}, torch::kUInt8);
  const auto coords = torch::arange(side, torch::kFloat) / static_cast<double>(side);
  const int64_t chunk = chunkFor(side);
  for (int64_t start = 0; start < n; start += chunk) {
    const int64_t b = std::min(chunk, n - start);
    const auto labels = split.labels.narrow(0, start, b);
    const auto k = kGratingsPerClass;
    const auto amplitude = 0.6 + 0.4 * torch::rand({b, k}, g);
    const auto jitter = [&] { return 2 * torch::rand({b, k}, g) - 1; };
    const auto frequency =
        classes.frequency.index_select(0, labels) * (1.0 + kFrequencyJitter * jitter());
    const auto angle = classes.angle.index_select(0, labels) + kAngleJitter * jitter();
    const auto waves = gratings(frequency, angle, 2 * kPi * torch::rand({b, k}, g), coords) *
                       amplitude.unsqueeze(-1).unsqueeze(-1);
    auto image = torch::einsum("bkhw,bkc->bchw", {waves, classes.colour.index_select(0, labels)});
    // Gratings of no class: the network must look for the right pair, not for any stripes.
    for (int64_t d = 0; d < kDistractors; ++d) {
      const auto distractor =
          gratings(1.0 + 3.0 * torch::rand({b, 1}, g), kPi * torch::rand({b, 1}, g),
                   2 * kPi * torch::rand({b, 1}, g), coords);
      const auto distractorColour =
          (2.0 * torch::rand({b, 3}, g) - 1.0) * kDistractorAmplitude * torch::rand({b, 1}, g);
      image += distractor * distractorColour.view({b, 3, 1, 1});
    }
    image += kNoise * torch::randn({b, 3, side, side}, g);
    split.images.narrow(0, start, b)
        .copy_((0.5 + kContrast * image).clamp(0.0, 1.0).mul(255.0).round().to(torch::kUInt8));
  }
  return split;
}

// Per-channel mean and standard deviation of uint8 images, in chunks (CIFAR-10 as float at
// once would be 600 MB).
void channelStatistics(const at::Tensor& images, at::Tensor& mean, at::Tensor& std) {
  auto sum = torch::zeros({3}, torch::kDouble);
  auto squares = torch::zeros({3}, torch::kDouble);
  const int64_t n = images.size(0);
  const int64_t chunk = chunkFor(images.size(2));
  for (int64_t start = 0; start < n; start += chunk) {
    const auto x = images.narrow(0, start, std::min(chunk, n - start)).to(torch::kDouble);
    sum += x.sum({0, 2, 3});
    squares += x.square().sum({0, 2, 3});
  }
  const double count = static_cast<double>(n * images.size(2) * images.size(3));
  const auto m = sum / count;
  mean = m.to(torch::kFloat);
  std = (squares / count - m.square()).clamp_min(1e-6).sqrt().to(torch::kFloat);
}

Split toSplit(const ImageSet& set) {
  Split split;
  // from_blob borrows; clone owns.
  split.images = torch::from_blob(const_cast<uint8_t*>(set.pixels.data()),
                                  {set.count, set.channels, set.side, set.side}, torch::kUInt8)
                     .clone();
  split.labels =
      torch::from_blob(const_cast<uint8_t*>(set.labels.data()), {set.count}, torch::kUInt8)
          .to(torch::kLong);
  return split;
}

// Random 32x32 crop of the zero-padded image and a coin-flip mirror, per image, on the device.
at::Tensor cropAndFlip(const at::Tensor& images, uint64_t seed) {
  const int64_t b = images.size(0), c = images.size(1), h = images.size(2), w = images.size(3);
  auto g = generator(seed);
  const auto device = images.device();
  const auto dy = torch::randint(0, 2 * kCropPadding + 1, {b}, g, torch::kLong).to(device);
  const auto dx = torch::randint(0, 2 * kCropPadding + 1, {b}, g, torch::kLong).to(device);
  const auto flip = (torch::rand({b}, g) < 0.5).to(device);
  const auto padded =
      torch::constant_pad_nd(images, {kCropPadding, kCropPadding, kCropPadding, kCropPadding}, 0);
  const auto opts = torch::TensorOptions().dtype(torch::kLong).device(device);
  const auto rows = (dy.view({b, 1}) + torch::arange(h, opts))
                        .view({b, 1, h, 1})
                        .expand({b, c, h, w + 2 * kCropPadding});
  const auto cropped = padded.gather(2, rows);
  const auto cols =
      (dx.view({b, 1}) + torch::arange(w, opts)).view({b, 1, 1, w}).expand({b, c, h, w});
  const auto out = cropped.gather(3, cols);
  return torch::where(flip.view({b, 1, 1, 1}), out.flip({3}), out);
}

}  // namespace

Dataset makeSynthetic(const SyntheticSpec& spec) {
  const auto classes = drawClasses(spec.classes, spec.seed);
  Dataset data;
  data.train = generateSplit(classes, spec.train_size, spec.side, mix(spec.seed, 1));
  data.test = generateSplit(classes, spec.test_size, spec.side, mix(spec.seed, 2));
  data.classes = spec.classes;
  // Flips and shifts would change which orientation (and so which class) an image shows.
  data.augment = false;
  channelStatistics(data.train.images, data.mean, data.std);
  data.description = "synthetic gratings: " + std::to_string(spec.train_size) + " train / " +
                     std::to_string(spec.test_size) + " test images, " + std::to_string(spec.side) +
                     "x" + std::to_string(spec.side) + ", " + std::to_string(spec.classes) +
                     " classes";
  return data;
}

Dataset fromCifar10(const Cifar10& cifar, bool augment) {
  Dataset data;
  data.train = toSplit(cifar.train);
  data.test = toSplit(cifar.test);
  data.classes = kCifarClasses;
  data.augment = augment;
  channelStatistics(data.train.images, data.mean, data.std);
  data.description = "CIFAR-10: " + std::to_string(cifar.train.count) + " train (" +
                     std::to_string(cifar.train_files.size()) + " files) / " +
                     std::to_string(cifar.test.count) + " test images" +
                     (augment ? ", random crop + flip" : "");
  return data;
}

void moveTo(Dataset& data, const c10::Device& device) {
  for (Split* s : {&data.train, &data.test}) {
    s->images = s->images.to(device);
    s->labels = s->labels.to(device);
  }
  data.mean = data.mean.to(device);
  data.std = data.std.to(device);
}

Batch makeBatch(const Dataset& data, const Split& split, const at::Tensor& indices,
                bool channelsLast, const uint64_t* augmentSeed) {
  auto images = split.images.index_select(0, indices);
  if (augmentSeed != nullptr && data.augment) images = cropAndFlip(images, *augmentSeed);
  auto x =
      images.to(torch::kFloat).sub_(data.mean.view({1, 3, 1, 1})).div_(data.std.view({1, 3, 1, 1}));
  if (channelsLast) x = x.contiguous(at::MemoryFormat::ChannelsLast);
  return {x, split.labels.index_select(0, indices)};
}

}  // namespace ddpl::example
