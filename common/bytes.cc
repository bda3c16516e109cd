#include "common/bytes.h"

#include <fmt/format.h>

namespace ddpl {

std::string humanBytes(int64_t bytes) {
  double b = static_cast<double>(bytes);
  if (bytes < 1024) return fmt::format("{}B", bytes);
  if (bytes < (int64_t{1} << 20)) return fmt::format("{:.0f}KiB", b / 1024);
  if (bytes < (int64_t{1} << 30)) return fmt::format("{:.0f}MiB", b / 1048576);
  return fmt::format("{:.1f}GiB", b / 1073741824);
}

std::string shortBytes(int64_t bytes) {
  double b = static_cast<double>(bytes);
  if (bytes < 1024) return fmt::format("{}B", bytes);
  if (bytes < (int64_t{1} << 20)) return fmt::format("{:.0f}K", b / 1024);
  if (bytes < (int64_t{10} << 30)) {
    if (bytes < (int64_t{1} << 30)) return fmt::format("{:.0f}M", b / 1048576);
    return fmt::format("{:.1f}G", b / 1073741824);
  }
  return fmt::format("{:.0f}G", b / 1073741824);
}

}  // namespace ddpl
