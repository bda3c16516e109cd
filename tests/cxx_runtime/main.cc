// Throws inside LibTorch (c10's TORCH_CHECK failure is thrown by libc10.so) and in this program,
// and prints what the throw-site capture recorded for each, and how many C++ runtimes the
// process maps. tests/cxx_runtime/run_test.sh judges the output.
#include <c10/util/Exception.h>

#include <cstdio>
#include <exception>
#include <fstream>
#include <stdexcept>
#include <string>

#include "worker/native_trace.h"

namespace {
size_t framesOf(void (*thrower)()) {
  try {
    thrower();
  } catch (...) {
    return ddpl::worker::throwStackOf(std::current_exception()).size();
  }
  return 0;
}

void throwInTorch() { TORCH_CHECK(false, "thrown by libc10.so"); }
void throwHere() { throw std::runtime_error("thrown by this program"); }

int runtimesMapped() {
  std::ifstream maps("/proc/self/maps");
  std::string line, last;
  int n = 0;
  while (std::getline(maps, line)) {
    const auto slash = line.find('/');
    if (slash == std::string::npos) continue;
    const std::string path = line.substr(slash);
    if (path.find("libstdc++") != std::string::npos && path != last) ++n;
    if (path.find("libstdc++") != std::string::npos) last = path;
  }
  return n;
}
}  // namespace

int main() {
  std::printf("recorded=%d\n", ddpl::worker::throwStacksRecorded() ? 1 : 0);
  std::printf("frames_torch=%zu\n", framesOf(throwInTorch));
  std::printf("frames_here=%zu\n", framesOf(throwHere));
  std::printf("libstdcxx_mapped=%d\n", runtimesMapped());
  return 0;
}
