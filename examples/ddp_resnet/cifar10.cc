#include "examples/ddp_resnet/cifar10.h"

#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <utility>

namespace ddpl::example {
namespace {

// "data_batch_<digits>.bin" -> the number; -1 for any other name.
long batchNumber(const std::string& name) {
  static const std::string kPrefix = "data_batch_", kSuffix = ".bin";
  if (name.size() <= kPrefix.size() + kSuffix.size() || name.rfind(kPrefix, 0) != 0 ||
      name.compare(name.size() - kSuffix.size(), kSuffix.size(), kSuffix) != 0) {
    return -1;
  }
  const std::string digits =
      name.substr(kPrefix.size(), name.size() - kPrefix.size() - kSuffix.size());
  if (digits.size() > 9 || !std::all_of(digits.begin(), digits.end(), ::isdigit)) return -1;
  return std::stol(digits);
}

void append(ImageSet& into, ImageSet&& part) {
  into.pixels.insert(into.pixels.end(), part.pixels.begin(), part.pixels.end());
  into.labels.insert(into.labels.end(), part.labels.begin(), part.labels.end());
  into.count += part.count;
}

}  // namespace

ImageSet readCifar10File(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) throw DataError(path + ": " + std::strerror(errno));
  if (!S_ISREG(st.st_mode)) throw DataError(path + ": not a regular file");
  const auto size = static_cast<int64_t>(st.st_size);
  if (size == 0) throw DataError(path + ": empty file (expected 3073-byte CIFAR-10 records)");
  if (size % kCifarRecordBytes != 0) {
    throw DataError(path + ": " + std::to_string(size) + " bytes is not a whole number of " +
                    std::to_string(kCifarRecordBytes) + "-byte CIFAR-10 records (" +
                    std::to_string(size / kCifarRecordBytes) + " full records and " +
                    std::to_string(size % kCifarRecordBytes) +
                    " bytes over): truncated or not CIFAR-10 binary format");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) throw DataError(path + ": cannot open: " + std::strerror(errno));
  std::vector<uint8_t> raw(static_cast<size_t>(size));
  if (!in.read(reinterpret_cast<char*>(raw.data()), size)) {
    throw DataError(path + ": read failed after " + std::to_string(in.gcount()) + " of " +
                    std::to_string(size) + " bytes");
  }

  ImageSet set;
  set.count = size / kCifarRecordBytes;
  set.labels.resize(static_cast<size_t>(set.count));
  set.pixels.resize(static_cast<size_t>(set.count * kCifarPixels));
  for (int64_t i = 0; i < set.count; ++i) {
    const uint8_t* record = raw.data() + i * kCifarRecordBytes;
    if (record[0] >= kCifarClasses) {
      // CIFAR-100's format (two label bytes, 3074-byte records) lands here as well.
      throw DataError(path + ": record " + std::to_string(i) + " has label " +
                      std::to_string(record[0]) +
                      ", but CIFAR-10 labels are 0-9: not CIFAR-10 binary format");
    }
    set.labels[static_cast<size_t>(i)] = record[0];
    std::memcpy(set.pixels.data() + i * kCifarPixels, record + 1, kCifarPixels);
  }
  return set;
}

Cifar10 loadCifar10(const std::string& dir) {
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) throw DataError("--data " + dir + ": " + std::strerror(errno));
  if (!S_ISDIR(st.st_mode)) throw DataError("--data " + dir + ": not a directory");

  std::vector<std::pair<long, std::string>> batches;
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) throw DataError("--data " + dir + ": cannot list: " + std::strerror(errno));
  while (const dirent* e = ::readdir(d)) {
    const long n = batchNumber(e->d_name);
    if (n >= 0) batches.emplace_back(n, e->d_name);
  }
  ::closedir(d);
  if (batches.empty()) {
    throw DataError(
        "--data " + dir +
        ": no data_batch_<n>.bin files (expected CIFAR-10's binary version, the files of "
        "cifar-10-batches-bin/)");
  }
  std::sort(batches.begin(), batches.end());

  Cifar10 data;
  for (const auto& [n, name] : batches) {
    const std::string path = dir + "/" + name;
    append(data.train, readCifar10File(path));
    data.train_files.push_back(path);
  }
  const std::string testPath = dir + "/test_batch.bin";
  if (::stat(testPath.c_str(), &st) != 0) {
    throw DataError("--data " + dir + ": test_batch.bin is missing (needed for evaluation)");
  }
  data.test = readCifar10File(testPath);
  return data;
}

}  // namespace ddpl::example
