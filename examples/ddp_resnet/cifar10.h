#pragma once
// CIFAR-10's binary format (cifar-10-batches-bin/): each record is one label byte (0-9) and
// 3072 pixel bytes, the 1024 red, then green, then blue values of a 32x32 image in row-major
// order. Torch-free on purpose: ddp_resnet validates the data before it builds a process group,
// and before LibTorch starts threads that would miss the Session's signal mask.
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace ddpl::example {

// Missing, unreadable, truncated or malformed data. The message names the file and the problem.
class DataError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

inline constexpr int64_t kCifarSide = 32;
inline constexpr int64_t kCifarChannels = 3;
inline constexpr int64_t kCifarPixels = kCifarChannels * kCifarSide * kCifarSide;  // 3072
inline constexpr int64_t kCifarRecordBytes = 1 + kCifarPixels;                     // 3073
inline constexpr int kCifarClasses = 10;

// uint8 images, channel-major per image ([count][channels][side][side]), as CIFAR stores them.
struct ImageSet {
  int64_t count = 0;
  int64_t channels = kCifarChannels;
  int64_t side = kCifarSide;
  std::vector<uint8_t> pixels;
  std::vector<uint8_t> labels;
};

struct Cifar10 {
  ImageSet train;  // data_batch_1.bin, data_batch_2.bin, ... concatenated in numeric order
  ImageSet test;   // test_batch.bin
  std::vector<std::string> train_files;
};

// Reads one batch file; throws DataError for a missing, empty, truncated or malformed file.
ImageSet readCifar10File(const std::string& path);

// Reads every data_batch_<n>.bin and test_batch.bin under dir.
Cifar10 loadCifar10(const std::string& dir);

}  // namespace ddpl::example
