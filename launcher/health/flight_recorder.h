#pragma once
// torch's flight recorder, as each rank tells launch on a hang (issue 48): the rank's last
// collectives (per process group: sequence number, operation, sizes) from torch's own dump
// (TORCH_FR_BUFFER_SIZE), which python/ddplaunch/_flight_recorder.py serves on a socket in the
// rank's log folder. torch 2.9.1 has no way to ask a Gloo process for it from outside (NCCL's
// pipe is read by ProcessGroupNCCL's monitor thread only; the control plane's handler dumps
// NCCL's recorder): docs/user-guide.md, "Hangs".
//
// parseFlightRecord is pure; askFlightRecorders talks to the ranks, bounded by its timeout.
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "common/environment.h"

namespace ddpl::launcher {

struct FlightEntry {
  std::string group;       // the process group's key: its pg_id ("0": the default group)
  std::string group_name;  // how the report names it: "default_pg", a description, or "pg 1"
  uint64_t seq = 0;        // collective_seq_id: the group's collectives, counted from 1
  std::string op;          // "all_reduce" (torch's profiling name without "gloo:"/"nccl:")
  std::string backend;     // "gloo", "nccl"
  std::string sizes;       // the input sizes as torch lists them: "[[256, 256]]"
  bool p2p = false;        // a send/recv: counted by p2p_seq_id, not by `seq`
};

struct FlightRecord {
  bool answered = false;
  std::string error;  // why there is no record, or what the rank said was missing
  // The newest collective each process group has had called on this rank (its
  // last_enqueued_collective), by group key. Entered, not completed: Gloo marks completion
  // late (torch 2.9.1 showed a finished all-reduce as not completed), so it is not used.
  std::map<std::string, uint64_t> last_enqueued;
  std::vector<FlightEntry> entries;  // the recorder's ring, oldest first
  // The entry of `group`'s collective `seq`, or null when the ring no longer holds it.
  const FlightEntry* find(const std::string& group, uint64_t seq) const;
};

// What a rank answered (python/ddplaunch/_flight_recorder.py: {"pid", "fr", "nccl", "error"}).
// Malformed input or numbers out of range give a record with `answered` false and the error.
FlightRecord parseFlightRecord(const std::string& json);

// Asks every rank's socket at once and waits for all of them at most `timeout_sec`; a rank
// that does not answer in time (stopped, or holding the GIL in native code) gets an error.
// Answers are cut at kMaxFlightRecordBytes.
inline constexpr size_t kMaxFlightRecordBytes = 4 << 20;
std::map<int, FlightRecord> askFlightRecorders(const std::map<int, std::string>& socket_of,
                                               double timeout_sec);

// Where rank's socket is: in its log folder (RUN_DIR/attempt_N/<local rank>/).
std::string flightRecorderSocket(const std::string& rank_dir);

// The entries of a recorder torch keeps when launch sets TORCH_FR_BUFFER_SIZE: the newest
// collectives of every group are what a report needs; 64 keep a few steps of a DDP job with
// several buckets. Costs 2.9-3.7 us of CPU per collective (docs/benchmarks.md).
inline constexpr int kFlightRecorderEntries = 64;

// What a worker needs to serve its record, in its environment: TORCH_FR_BUFFER_SIZE for every
// worker (read once at torch's start, so the same for the warm template), unless the user's
// environment `base` sets it or its older name (TORCH_NCCL_TRACE_BUFFER_SIZE; 0 turns the
// recorder off)...
void addFlightRecorderBuffer(Environment& env, const Environment& base);
// ...and DDPL_FLIGHT_RECORDER_SOCKET for each rank. False, and nothing added, when the socket's
// path is too long for a Unix socket.
bool addFlightRecorderSocket(Environment& env, const std::string& rank_dir);

}  // namespace ddpl::launcher
