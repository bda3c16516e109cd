#pragma once
// Writes small files in CIFAR-10's binary format for the example's tests. Each class has its own
// colour and a bright bar in its own row band, plus noise, so that a network can learn it in a
// few steps and a reader that misaligns labels and pixels by even one byte cannot.
#include <cstdint>
#include <fstream>
#include <random>
#include <string>
#include <vector>

namespace ddpl::example::testing {

inline constexpr int kRecordBytes = 3073;

inline std::vector<uint8_t> cifarRecord(int label, std::mt19937& rng) {
  std::vector<uint8_t> r(kRecordBytes);
  r[0] = static_cast<uint8_t>(label);
  std::uniform_int_distribution<int> noise(-40, 40);
  const int base[3] = {30 + 20 * label, 220 - 18 * label, (60 + 67 * label) % 200};
  for (int c = 0; c < 3; ++c) {
    for (int y = 0; y < 32; ++y) {
      for (int x = 0; x < 32; ++x) {
        int v = base[c] + noise(rng);
        if (y / 3 == label) v += 90;  // the class's bar
        r[1 + c * 1024 + y * 32 + x] = static_cast<uint8_t>(v < 0 ? 0 : v > 255 ? 255 : v);
      }
    }
  }
  return r;
}

// `records` records with labels cycling 0..9, from a fixed seed.
inline void writeCifarFile(const std::string& path, int records, unsigned seed) {
  std::mt19937 rng(seed);
  std::ofstream out(path, std::ios::binary);
  for (int i = 0; i < records; ++i) {
    const auto r = cifarRecord(i % 10, rng);
    out.write(reinterpret_cast<const char*>(r.data()), static_cast<std::streamsize>(r.size()));
  }
}

}  // namespace ddpl::example::testing
