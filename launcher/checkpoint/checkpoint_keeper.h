#pragma once
// The agent's part for checkpoints in memory (docs/checkpoints.md): owns the memory tier
// (memory_tier.h) and, in jobs of several nodes, its peer replicas (replica.h). It turns the
// options into the tier (or none), hands each group's workers the tier's variables, publishes
// this node's replica endpoint and finds its successor's, fetches what a replacement node lost
// from the peers, keeps the per-rank figures the live view shows, and says at the end what was
// kept and persisted.
//
// Nothing runs for a job that never checkpoints: the tier only names its root until a worker
// makes it (memory_tier.h); this part adds nothing to that.
//
// Threads: the agent's loop thread calls every public function. The tier's persister thread
// ("ckpt-persister") calls NodeValues::nodeValue to find the successor. One wait on the loop
// thread, kept from before this part: a node that joins a running job with nothing in memory
// for its ranks fetches their newest steps before its workers start (10 s at most for the peers'
// endpoints, 60 s per fetch).
#include <sys/types.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "launcher/checkpoint/memory_tier.h"
#include "launcher/membership/node_values.h"
#include "rendezvous/state/round_rules.h"

namespace ddpl::launcher {

struct CheckpointKeeperOptions {
  std::optional<uint64_t> memory;  // --checkpoint-memory per rank; unset: automatic; 0: off
  int keep = 1;                    // --checkpoint-memory-keep
  std::string durable_dir;         // --checkpoint-dir, as given; empty: the programs' own
  int nproc = 1;                   // this node's workers
  std::string advertised_host;     // where the other nodes reach this node's replica server
  double drain_timeout_sec = 0;    // --checkpoint-drain-timeout
};

class CheckpointKeeper {
 public:
  // `node_values`: the job's value per node (membership/node_values.h), where the replicas'
  // endpoints are published and found; of membership the keeper needs nothing else. It must
  // outlive the keeper. Checkpoints in memory are on unless options.memory is 0. An automatic
  // budget that cannot be had (no /dev/shm) turns them off with a warning; an explicit one throws
  // ddpl::Error.
  CheckpointKeeper(CheckpointKeeperOptions options, NodeValues& node_values);
  ~CheckpointKeeper();
  CheckpointKeeper(const CheckpointKeeper&) = delete;
  CheckpointKeeper& operator=(const CheckpointKeeper&) = delete;

  bool on() const { return tier_ != nullptr; }
  // The tier's root (for the watchdog to remove should launch die); on() only.
  const std::string& root() const;

  // Before a group starts at `place` (restart `restart_count` of the job): the variables to
  // add to its workers' environment (none when off). Several nodes: the replicas, and the
  // fetch of a replacement's lost steps (the wait above).
  std::map<std::string, std::string> startGroup(const rdzv::round_rules::NodePlace& place,
                                                int restart_count);
  // Each monitor tick: the tier's look for a first checkpoint; the figures once a second.
  void tick(double now);
  void onWorkerExit(int64_t global_rank, pid_t pid);
  // The bytes a rank holds in memory (committed and partial), none when it holds nothing.
  std::optional<int64_t> bytesOf(int64_t global_rank) const;

  // At the end of the run: persists what is left (--checkpoint-drain-timeout at most) and
  // returns the line that says so ("" when off or nothing was to do).
  std::string drain();
  // One line: what each rank holds in memory and what reached the disk.
  void logSummary() const;
  // The line drain() returned: a warning when something was not persisted.
  static void logDrained(const std::string& line);

 private:
  // `stayed`: this node was in the round before `place`'s, in the same place.
  void startReplicas(const std::vector<int64_t>& ranks, const rdzv::round_rules::NodePlace& place,
                     int restart_count, bool stayed);

  CheckpointKeeperOptions options_;
  NodeValues& node_values_;
  std::unique_ptr<MemoryTier> tier_;          // null: checkpoints in memory are off
  std::vector<RankCheckpointStatus> status_;  // refreshed once a second
  // Where this node's last group started: a node that was not in the round before may have
  // missed the others' steps (startReplicas).
  std::optional<rdzv::round_rules::NodePlace> last_place_;
  double next_status_ = 0;
};

}  // namespace ddpl::launcher
