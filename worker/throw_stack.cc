// Where each exception was thrown, kept for the error report (worker/error_report.cc): by the
// time an exception is caught and reported, or reaches std::terminate through a noexcept
// function, the frames of its throw are unwound, and only the exception object survives.
//
// So the object is tagged when it is made. A program linked with this library defines
// __cxa_allocate_exception itself (executables come first in symbol lookup, and the worker's
// programs export their symbols: -rdynamic), so every `throw`, in our code, in libstdc++ and in
// LibTorch, calls this one: it records the return addresses of the stack, and nothing else (no
// symbol lookup, no allocation, no lock), then calls the C++ runtime's own. The allocation and
// not __cxa_throw: it happens at the throw expression all the same, and it is also where
// std::make_exception_ptr makes an exception that is never thrown, which must not inherit the
// stack of an older exception that lay at the same address.
//
// The records live in a fixed table indexed by the object's address: a lookup needs no search,
// an exception thrown in one thread and reported in another (std::future, std::exception_ptr) is
// found, and a record is only lost when a later exception lands in its slot (1 in kSlots per
// throw that happens between the throw and the report). Each slot is a seqlock: a reader that
// overlaps a writer sees a changed version and reports no frames rather than torn ones.
//
// The cost is the walk, libgcc's unwinder (the one `throw` itself uses), about 0.12 us a frame
// (GCC 12, glibc 2.36, one core of a 2-core VM, thread CPU time, best of 5): +0.8 us for a throw
// 5 frames deep, +5.5 us from 48 frames on. For scale, without it a throw caught in main costs
// 0.9 us from 5 frames deep, 10 us from 45 (with it: 1.7 and 15 us); a TORCH_CHECK failure, which
// captures its own backtrace already, 12 us from 45 frames (16.6 us). The worst case is a throw
// caught right away deep in a stack: 1.2 us becomes 7.7 us. A ddp_resnet training run (1 and 2
// ranks, Gloo) throws no exception at all, so this lands on error paths; a program that throws on
// a hot path turns it off with setThrowStackFrames(0).
#include <cxxabi.h>
#include <dlfcn.h>
#include <unistd.h>
#include <unwind.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <typeinfo>

#include "worker/native_trace.h"

// worker/CMakeLists.txt: 0 where a program cannot define __cxa_allocate_exception beside the C++
// runtime it links (a static runtime): nothing is interposed and nothing is recorded.
#ifndef DDPL_THROW_STACK
#define DDPL_THROW_STACK 1
#endif

#if !DDPL_THROW_STACK
namespace ddpl::worker {
size_t setThrowStackFrames(size_t) { return 0; }
std::vector<uintptr_t> throwStackOf(const std::exception_ptr&) { return {}; }
bool throwStacksRecorded() { return false; }
}  // namespace ddpl::worker
#else

namespace ddpl::worker {
namespace {

constexpr size_t kSlots = 256;

struct Slot {
  std::atomic<uint64_t> version;  // odd while a writer fills the slot
  std::atomic<uintptr_t> object;  // the exception object (what __cxa_allocate_exception returned)
  std::atomic<uint32_t> count;
  std::atomic<uintptr_t> frames[kThrowStackFrames];
};

// Zero-initialised before any code runs: exceptions thrown by static initialisers are recorded.
Slot slots[kSlots];

Slot& slotOf(uintptr_t object) {
  // Fibonacci hashing: allocations are 16-byte aligned and often close together.
  return slots[(object * 0x9E3779B97F4A7C15ull) >> (64 - 8)];
}
static_assert(kSlots == 256, "the hash above keeps 8 bits");

std::atomic<uint32_t> frameLimit{kThrowStackFrames};

struct Walk {
  uintptr_t* frames;
  uint32_t count;
  uint32_t limit;
  bool skipped_self;
};

_Unwind_Reason_Code onFrame(_Unwind_Context* context, void* arg) {
  auto* walk = static_cast<Walk*>(arg);
  // The first frame is the one that called _Unwind_Backtrace: __cxa_allocate_exception below.
  if (!walk->skipped_self) {
    walk->skipped_self = true;
    return _URC_NO_REASON;
  }
  const uintptr_t ip = _Unwind_GetIP(context);
  if (ip == 0 || walk->count >= walk->limit) return _URC_END_OF_STACK;
  walk->frames[walk->count++] = ip;
  return _URC_NO_REASON;
}

void record(uintptr_t object, const uintptr_t* frames, uint32_t count) {
  Slot& slot = slotOf(object);
  uint64_t version = slot.version.load(std::memory_order_relaxed);
  // Another thread is writing this slot right now: its exception keeps it, ours goes unrecorded.
  if ((version & 1) != 0 ||
      !slot.version.compare_exchange_strong(version, version + 1, std::memory_order_acquire))
    return;
  slot.object.store(object, std::memory_order_relaxed);
  slot.count.store(count, std::memory_order_relaxed);
  for (uint32_t i = 0; i < count; ++i) slot.frames[i].store(frames[i], std::memory_order_relaxed);
  slot.version.store(version + 2, std::memory_order_release);
}

using AllocateFn = void* (*)(size_t) noexcept;

AllocateFn runtimeAllocate() {
  static std::atomic<AllocateFn> real{nullptr};
  AllocateFn fn = real.load(std::memory_order_acquire);
  if (fn == nullptr) {
    fn = reinterpret_cast<AllocateFn>(::dlsym(RTLD_NEXT, "__cxa_allocate_exception"));
    if (fn == nullptr) {
      // Only possible with a static C++ runtime, which the configure-time check keeps out.
      static const char kMessage[] = "ddplaunch worker: no C++ runtime __cxa_allocate_exception\n";
      (void)!::write(STDERR_FILENO, kMessage, sizeof(kMessage) - 1);
      std::abort();
    }
    real.store(fn, std::memory_order_release);
  }
  return fn;
}

// Looked up once at load, not at the first throw, which may come with the loader busy or memory
// short.
__attribute__((constructor)) void resolveRuntimeAllocate() { runtimeAllocate(); }

}  // namespace

bool throwStacksRecorded() { return true; }

size_t setThrowStackFrames(size_t frames) {
  const uint32_t limit =
      static_cast<uint32_t>(frames < kThrowStackFrames ? frames : kThrowStackFrames);
  return frameLimit.exchange(limit, std::memory_order_relaxed);
}

std::vector<uintptr_t> throwStackOf(const std::exception_ptr& error) {
  if (!error) return {};
  // libstdc++'s exception_ptr is the exception object's address and nothing else (its ABI).
  static_assert(sizeof(std::exception_ptr) == sizeof(void*), "libstdc++'s exception_ptr layout");
  uintptr_t object = 0;
  std::memcpy(&object, &error, sizeof(object));
  const Slot& slot = slotOf(object);
  const uint64_t before = slot.version.load(std::memory_order_acquire);
  if ((before & 1) != 0 || slot.object.load(std::memory_order_relaxed) != object) return {};
  const uint32_t count = slot.count.load(std::memory_order_relaxed);
  std::vector<uintptr_t> frames(count < kThrowStackFrames ? count : kThrowStackFrames);
  for (size_t i = 0; i < frames.size(); ++i)
    frames[i] = slot.frames[i].load(std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_acquire);
  if (slot.version.load(std::memory_order_relaxed) != before) return {};
  return frames;
}

}  // namespace ddpl::worker

namespace __cxxabiv1 {
extern "C" void* __cxa_allocate_exception(size_t size) noexcept {
  using namespace ddpl::worker;
  uintptr_t frames[kThrowStackFrames];
  Walk walk{frames, 0, frameLimit.load(std::memory_order_relaxed), false};
  if (walk.limit > 0) _Unwind_Backtrace(onFrame, &walk);
  void* object = runtimeAllocate()(size);
  // The runtime's own allocation ends the program when memory runs out; object is never null.
  record(reinterpret_cast<uintptr_t>(object), frames, walk.count);
  return object;
}
}  // namespace __cxxabiv1
#endif  // DDPL_THROW_STACK
