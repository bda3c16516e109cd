#pragma once
// The progress channel from a worker to its launcher: launch gives each worker a small shared
// memory file (a memfd) whose descriptor number it names in DDPL_HEARTBEAT_FD. The worker writes
// its step count there as an 8-byte little-endian integer at offset 0 (a store to mapped memory
// from C++, one pwrite from Python); launch reads it at every --monitor-interval. A worker that
// never writes keeps step 0 and is treated as not reporting progress.
//
// Python, standard library only (a no-op where the variable is absent, e.g. under torchrun):
//   hb = int(os.environ.get("DDPL_HEARTBEAT_FD", -1))
//   ... every step:  hb >= 0 and os.pwrite(hb, step.to_bytes(8, "little"), 0)
//   ... and, to be told apart as a straggler in a lockstep job, the waits too:
//   hb >= 0 and os.pwrite(hb, waited_us.to_bytes(8, "little"), 8)
//   ... and after the last step, before the teardown (final save, destroy_process_group, exit):
//   hb >= 0 and os.pwrite(hb, (step + 1).to_bytes(8, "little"), 24)
#include <cstddef>

#include "common/defaults.h"

namespace ddpl {

inline constexpr const char* kHeartbeatFdEnv = envvar::kHeartbeatFd;
inline constexpr size_t kHeartbeatBytes = 64;
// Offsets of the little-endian 64-bit fields: the step count, and (optional) the microseconds
// spent so far waiting inside collectives, which lets launch tell a rank that is slow from the
// ranks that wait for it (DistributedDataParallel writes both; the rest is reserved).
inline constexpr size_t kHeartbeatStepOffset = 0;
inline constexpr size_t kHeartbeatWaitOffset = 8;
// The microseconds this process spent restoring its state from a checkpoint (finding the step
// every rank has, reading it): written by ddplaunch.checkpoint, read by launch for the restart's
// phases (launcher/warm/restart_phases.h).
inline constexpr size_t kHeartbeatRestoreOffset = 16;
// The worker made its last step: what it does now is teardown (a final save, destroying its
// process groups, the interpreter's exit), which no step will follow, so the hang timeout no
// longer applies to it; launch holds it to --hang-finish-timeout instead. Written as the step
// count it finished at plus one (0: still stepping), so that a step after it cancels it
// without a second write: the mark holds only while the step field equals the mark less one.
inline constexpr size_t kHeartbeatFinishedOffset = 24;
// The checkpoint this attempt resumed from, for the incident table (launcher/warm/
// restart_phases.h): its step plus one (0: none restored), and where it came from (1 memory,
// 2 peer, 3 disk; anything else: none). Written by ddplaunch.checkpoint.latest() (Python); the
// C++ worker library does not write them yet, so its restarts show "restore: none" and count
// the steps it reports as global.
inline constexpr size_t kHeartbeatRestoredStepOffset = 32;
inline constexpr size_t kHeartbeatRestoreSourceOffset = 40;

}  // namespace ddpl
