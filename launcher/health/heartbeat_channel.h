#pragma once
// launch's end of a worker's heartbeat (the layout is common/heartbeat.h): the sealed memfd the
// worker inherits and writes its step to, and launch's read-only mapping of it; and the
// channels of one group's workers, which the agent holds.
//
// Threads: the agent's loop thread (the worker writes from its own process).
#include <cstdint>
#include <memory>
#include <vector>

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
  uint64_t restoredStep() const;   // the step it resumed from plus one (0: none)
  uint64_t restoreSource() const;  // where that came from, as written (1..3; unchecked)
  // The worker marked its last step done and has made none since (kHeartbeatFinishedOffset).
  bool finishedStepping() const;

 private:
  HeartbeatChannel(int fd, const volatile uint64_t* map) : fd_(fd), map_(map) {}
  int fd_;
  const volatile uint64_t* map_;
};

// The heartbeats of the current group's workers, by local rank: each opened as its worker
// starts, all closed when the next group starts and when the agent ends.
class HeartbeatChannels {
 public:
  // Closes the previous group's channels; `nproc` places, none open.
  void startGroup(int nproc);
  // Opens local rank's channel: null when the kernel refuses (its worker gets none).
  const HeartbeatChannel* open(int local_rank);
  void closeAll();
  // Local rank's readings; 0 (false) where it has no channel.
  uint64_t step(int local_rank) const;
  uint64_t waitedMicros(int local_rank) const;
  bool finishedStepping(int local_rank) const;
  uint64_t restoredStep(int local_rank) const;
  uint64_t restoreSource(int local_rank) const;
  // The longest time a rank of the group spent reading its checkpoint.
  uint64_t longestRestoreMicros() const;

 private:
  const HeartbeatChannel* at(int local_rank) const;
  std::vector<std::unique_ptr<HeartbeatChannel>> channels_;
};

}  // namespace ddpl::launcher
