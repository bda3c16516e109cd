#pragma once
// launch's end of a worker's heartbeat (the layout is common/heartbeat.h): the sealed memfd the
// worker inherits and writes its step to, and launch's read-only mapping of it.
#include <cstdint>
#include <memory>

namespace ddpl::launcher {

class HeartbeatChannel {
 public:
  // Null when the kernel refuses a memfd, its sealing or its mapping: the worker then simply
  // gets no DDPL_HEARTBEAT_FD.
  static std::unique_ptr<HeartbeatChannel> open();
  ~HeartbeatChannel();
  HeartbeatChannel(const HeartbeatChannel&) = delete;
  HeartbeatChannel& operator=(const HeartbeatChannel&) = delete;

  // The descriptor the worker inherits (close-on-exec here; the spawn passes it on).
  int fd() const { return fd_; }
  uint64_t step() const;
  uint64_t waitedMicros() const;
  uint64_t restoreMicros() const;  // time spent reading a checkpoint (0: none reported)
  // The worker marked its last step done and has made none since (kHeartbeatFinishedOffset).
  bool finishedStepping() const;

 private:
  HeartbeatChannel(int fd, const volatile uint64_t* map) : fd_(fd), map_(map) {}
  int fd_;
  const volatile uint64_t* map_;
};

}  // namespace ddpl::launcher
