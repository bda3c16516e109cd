#include "launcher/health/heartbeat_channel.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>

#include "common/heartbeat.h"

namespace ddpl::launcher {

// Its size is sealed before the worker sees it: a worker that shrank the file would make our
// next read of the mapping a SIGBUS, killing launch (issue 33). Without sealing (a kernel that
// refuses it) there is no channel at all.
std::unique_ptr<HeartbeatChannel> HeartbeatChannel::open() {
  int fd = memfd_create("ddpl-heartbeat", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return nullptr;
  void* map = MAP_FAILED;
  if (ftruncate(fd, kHeartbeatBytes) == 0 &&
      fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) == 0)
    map = mmap(nullptr, kHeartbeatBytes, PROT_READ, MAP_SHARED, fd, 0);
  if (map == MAP_FAILED) {
    close(fd);
    return nullptr;
  }
  return std::unique_ptr<HeartbeatChannel>(
      new HeartbeatChannel(fd, static_cast<const volatile uint64_t*>(map)));
}

HeartbeatChannel::~HeartbeatChannel() {
  munmap(const_cast<uint64_t*>(map_), kHeartbeatBytes);
  close(fd_);
}

// Little-endian on disk and in memory alike on the machines we run on (x86-64, AArch64).
uint64_t HeartbeatChannel::step() const { return map_[kHeartbeatStepOffset / sizeof(uint64_t)]; }
uint64_t HeartbeatChannel::waitedMicros() const {
  return map_[kHeartbeatWaitOffset / sizeof(uint64_t)];
}

uint64_t HeartbeatChannel::restoreMicros() const {
  return map_[kHeartbeatRestoreOffset / sizeof(uint64_t)];
}

uint64_t HeartbeatChannel::restoredStep() const {
  return map_[kHeartbeatRestoredStepOffset / sizeof(uint64_t)];
}

uint64_t HeartbeatChannel::restoreSource() const {
  return map_[kHeartbeatRestoreSourceOffset / sizeof(uint64_t)];
}

bool HeartbeatChannel::finishedStepping() const {
  // Two reads, not one snapshot: a reading that falls between a worker's two writes gives the
  // answer before them, and the next reading (a --monitor-interval later) the one after.
  uint64_t step = this->step();
  uint64_t mark = map_[kHeartbeatFinishedOffset / sizeof(uint64_t)];
  return mark != 0 && mark - 1 == step;
}

void HeartbeatChannels::startGroup(int nproc) {
  closeAll();
  channels_.resize(static_cast<size_t>(nproc));
}

const HeartbeatChannel* HeartbeatChannels::open(int local_rank) {
  auto& slot = channels_.at(static_cast<size_t>(local_rank));
  slot = HeartbeatChannel::open();
  return slot.get();
}

void HeartbeatChannels::closeAll() { channels_.clear(); }

const HeartbeatChannel* HeartbeatChannels::at(int local_rank) const {
  if (local_rank < 0 || static_cast<size_t>(local_rank) >= channels_.size()) return nullptr;
  return channels_[static_cast<size_t>(local_rank)].get();
}

uint64_t HeartbeatChannels::step(int local_rank) const {
  const HeartbeatChannel* c = at(local_rank);
  return c ? c->step() : 0;
}

uint64_t HeartbeatChannels::waitedMicros(int local_rank) const {
  const HeartbeatChannel* c = at(local_rank);
  return c ? c->waitedMicros() : 0;
}

bool HeartbeatChannels::finishedStepping(int local_rank) const {
  const HeartbeatChannel* c = at(local_rank);
  return c && c->finishedStepping();
}

uint64_t HeartbeatChannels::restoredStep(int local_rank) const {
  const HeartbeatChannel* c = at(local_rank);
  return c ? c->restoredStep() : 0;
}

uint64_t HeartbeatChannels::restoreSource(int local_rank) const {
  const HeartbeatChannel* c = at(local_rank);
  return c ? c->restoreSource() : 0;
}

uint64_t HeartbeatChannels::longestRestoreMicros() const {
  uint64_t longest = 0;
  for (const auto& c : channels_)
    if (c) longest = std::max<uint64_t>(longest, c->restoreMicros());
  return longest;
}

}  // namespace ddpl::launcher
