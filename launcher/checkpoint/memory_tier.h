#pragma once
// The agent's side of checkpoints in memory (docs/checkpoints.md): a private root on /dev/shm
// that outlives the workers, one directory per rank, and a thread that persists what workers
// commit to its durable place in the background, at idle I/O priority, newest first; when a
// worker dies, its newest committed step is persisted before anything else. The workers write
// and commit themselves (common/checkpoint_files.h); launch only watches (inotify), copies,
// reports the memory each rank holds, and removes the root at exit.
//
// Nothing of it runs for a job that never checkpoints: launch only names the root; the first
// worker to write makes it and its rank's directory (ckpt::makeRankDir), and launch starts
// watching (the inotify descriptor, the persister thread) when it finds one, at its next tick,
// a worker's exit or the end of the run. Until then a job pays one opendir a tick, and its
// exit waits for nothing: closing an inotify descriptor that held watches waits for an SRCU
// grace period, ~12 ms on the machines of issue 44, and the persister runs at nice 19.
//
// Threading: the agent's loop thread calls every public function; the persister thread
// ("ckpt-persister", started with the watching) owns the queue and shares the per-rank status
// and the watches under a mutex.
#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "launcher/checkpoint/replica.h"

namespace ddpl::launcher {

struct MemoryTierOptions {
  uint64_t budget_per_rank = 0;
  int64_t keep = 1;
  std::string durable_dir;  // launch's --checkpoint-dir (absolute); empty: the programs' own
  std::string base = "/dev/shm";
};

struct RankCheckpointStatus {
  int64_t rank = 0;
  uint64_t committed_bytes = 0;
  uint64_t partial_bytes = 0;
  int64_t newest_step = -1;     // committed in memory; -1: none
  int64_t persisted_step = -1;  // newest persisted by launch; -1: none
  bool persists = true;         // false: a replicated state, which rank 0's copy persists
  std::string error;            // the last persistence failure, empty when the last one worked
};

class MemoryTier {
 public:
  // The automatic budget: a quarter of the file system at `base` over `nproc` ranks; 0 when it
  // cannot be read.
  static uint64_t autoBudget(const std::string& base, int nproc);

  // Names the root (options.base/ddpl-ckpt-<pid>-<12 random characters>) without making it.
  // Throws ddpl::Error naming options.base when this user cannot make directories there.
  explicit MemoryTier(MemoryTierOptions options);
  ~MemoryTier();  // stops the thread, if started (without waiting for persistence: see drain),
                  // and removes the root
  MemoryTier(const MemoryTier&) = delete;
  MemoryTier& operator=(const MemoryTier&) = delete;

  const std::string& root() const;
  uint64_t budgetPerRank() const;

  // Before a group starts: its global ranks are this node's (their workers make their
  // directories when they first write). Directories of ranks no longer on this node are
  // persisted (newest step) and removed. Returns the variables to add to the workers'
  // environment.
  std::map<std::string, std::string> startGroup(const std::vector<int64_t>& global_ranks);

  // Every monitor tick: until the tier watches, whether a worker has made a rank directory
  // (one opendir); the watching starts then. A failure to watch is logged once; what the
  // workers committed then stays in memory and drain says where.
  void tick();

  // A worker exited: its half-written steps go, and its newest committed step is persisted
  // before anything else.
  void onWorkerExit(int64_t global_rank, pid_t pid);

  std::vector<RankCheckpointStatus> status() const;

  // ---- Peer replicas (several nodes): this node keeps its predecessor's newest steps in a
  // ReplicaServer and pushes its own to its successor (launcher/checkpoint/replica.h).
  // Starts the server once (it makes the root, to keep the replicas in); returns the endpoint
  // to publish ("host port secret").
  std::string startReplicas(const std::string& advertised_host, int nproc);
  // A new round: the successor is unknown until `lookup` (called on the persister thread, at
  // most every 2 s while a commit waits to be sent; it may block on the job's store) finds it.
  void setSuccessorLookup(std::function<std::optional<ReplicaEndpoint>()> lookup);
  // Whether some of `ranks` has no committed step of this world size in this node's memory.
  bool missing(const std::vector<int64_t>& ranks, int64_t world_size) const;
  // Before a group starts: each of `ranks` gets the newest committed step of this world size
  // any peer holds, when it is newer than this node's newest (none here counts as older than
  // any). Returns what happened, a line per rank, for the log.
  std::vector<std::string> pullNewer(const std::vector<int64_t>& ranks, int64_t world_size,
                                     const std::vector<ReplicaEndpoint>& peers, double timeout_sec);

  // At the end of the run: persists what is committed but not yet persisted (at normal
  // priority), waiting at most `timeout_sec`. Returns a line for the log ("" when nothing was
  // to do).
  std::string drain(double timeout_sec);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ddpl::launcher
