#include "worker/heartbeat.h"

#include <sys/mman.h>

#include <atomic>

#include "common/heartbeat.h"

namespace ddpl::worker::heartbeat {
namespace {
// The mapped step counter, or null. Set once by open(); never unmapped (launch may read it to
// the process's last instruction).
std::atomic<std::atomic<uint64_t>*> slot{nullptr};  // [0] step, [1] waited microseconds
}  // namespace

bool open(int fd) {
  if (fd < 0) return false;
  void* map = mmap(nullptr, kHeartbeatBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (map == MAP_FAILED) return false;
  std::atomic<uint64_t>* expected = nullptr;
  if (!slot.compare_exchange_strong(expected, static_cast<std::atomic<uint64_t>*>(map))) {
    munmap(map, kHeartbeatBytes);  // already open
  }
  return true;
}

void beat() {
  if (auto* s = slot.load(std::memory_order_relaxed)) s->fetch_add(1, std::memory_order_relaxed);
}

void set(uint64_t step) {
  if (auto* s = slot.load(std::memory_order_relaxed)) s->store(step, std::memory_order_relaxed);
}

void addWaitMicroseconds(uint64_t us) {
  if (auto* s = slot.load(std::memory_order_relaxed))
    s[kHeartbeatWaitOffset / sizeof(uint64_t)].fetch_add(us, std::memory_order_relaxed);
}

void finished() {
  // The mark is the step count plus one (common/heartbeat.h): it holds while the step field
  // equals it less one, so a later beat() cancels it without a second write.
  if (auto* s = slot.load(std::memory_order_relaxed))
    s[kHeartbeatFinishedOffset / sizeof(uint64_t)].store(s->load(std::memory_order_relaxed) + 1,
                                                          std::memory_order_relaxed);
}

uint64_t current() {
  auto* s = slot.load(std::memory_order_relaxed);
  return s ? s->load(std::memory_order_relaxed) : 0;
}

}  // namespace ddpl::worker::heartbeat
