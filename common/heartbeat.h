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
#include <cstddef>

namespace ddpl {

inline constexpr const char* kHeartbeatFdEnv = "DDPL_HEARTBEAT_FD";
inline constexpr size_t kHeartbeatBytes = 64;  // the step at offset 0; the rest reserved

}  // namespace ddpl
