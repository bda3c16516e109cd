// The cost of reporting a step to launch (common/heartbeat.h) from C++: worker/heartbeat.h's
// beat() on a memfd mapping, as DistributedDataParallel calls it once per optimizer step.
// usage: heartbeat_bench [CALLS]   (prints nanoseconds per call, median of 7 runs)
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include "common/heartbeat.h"
#include "common/parse.h"
#include "worker/heartbeat.h"

int main(int argc, char** argv) {
  int64_t calls = 10'000'000;
  try {
    if (argc > 1) calls = ddpl::parseInteger("CALLS", argv[1], 1, 1'000'000'000);
  } catch (const ddpl::InvalidArgument& e) {
    std::fprintf(stderr, "heartbeat_bench: %s\n", e.what());
    return 2;
  }
  int fd = memfd_create("heartbeat-bench", MFD_CLOEXEC);
  if (fd < 0 || ftruncate(fd, ddpl::kHeartbeatBytes) != 0 || !ddpl::worker::heartbeat::open(fd)) {
    std::perror("heartbeat_bench: memfd");
    return 1;
  }
  std::vector<double> ns;
  for (int run = 0; run < 7; ++run) {
    auto t0 = std::chrono::steady_clock::now();
    for (int64_t i = 0; i < calls; ++i) ddpl::worker::heartbeat::beat();
    auto t1 = std::chrono::steady_clock::now();
    ns.push_back(std::chrono::duration<double, std::nano>(t1 - t0).count() / calls);
  }
  std::sort(ns.begin(), ns.end());
  std::printf("C++ heartbeat::beat(): median %.2f ns per call (min %.2f, max %.2f, 7 runs of %lld)"
              "; step count %llu\n",
              ns[3], ns.front(), ns.back(), static_cast<long long>(calls),
              static_cast<unsigned long long>(ddpl::worker::heartbeat::current()));
  return 0;
}
