#pragma once
// This process's progress channel to `launch` (common/heartbeat.h): a step counter in a memfd
// that launch maps too. Process-wide, as the descriptor it comes from: Session opens it from
// SessionOptions::heartbeat_fd, DistributedDataParallel beats once per synchronised backward
// (one optimizer step), and a program may report its own steps instead. Without launch (no
// descriptor) every call is a no-op. Thread-safe; a beat is one relaxed atomic store.
#include <cstdint>

namespace ddpl::worker::heartbeat {

// Maps `fd` (launch's memfd). Returns false, and stays a no-op, when it cannot be mapped.
bool open(int fd);
// The step count: the next one, or the given one.
void beat();
void set(uint64_t step);
uint64_t current();
// Time spent waiting inside collectives, added up (lets launch find stragglers).
void addWaitMicroseconds(uint64_t us);
// The last step is done: what follows is teardown (a final save, destroying process groups, the
// exit), which launch holds to --hang-finish-timeout instead of the hang timeout. A step after it
// cancels it. Session's end calls it on a normal exit; a program calls it sooner to cover a long
// final save.
void finished();

}  // namespace ddpl::worker::heartbeat
