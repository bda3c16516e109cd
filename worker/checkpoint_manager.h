#pragma once
// A checkpoint directory and the resume policy of an elastic training job: where checkpoints go,
// how many are kept, and what a start of the program resumes from.
//
// Files are DIR/ckpt-step<8 digits>.pt (the step in the name, so "latest" is a listing, never a
// pointer file that could itself be half-written) and DIR/run_id (the job they belong to).
//
// The resume rule, in full:
//  1. Whether to resume: after a restart (SessionOptions::restart_count > 0), when the job is the
//     one that wrote the directory (same run id: the group re-formed around a node that left or
//     joined), or when the caller asks (CheckpointPolicy::resume). Otherwise it is a new job and
//     the earlier run's checkpoints are removed, so that no later restart can pick one up.
//  2. What: the newest complete checkpoint. A file whose archive is truncated (it ends before
//     the zip end-of-archive record: a copy cut short, a full disk on a filesystem that lied
//     about fsync) is reported by name as truncated and skipped for the next older one. Our own
//     writes are atomic, so this only happens to files damaged after the fact.
//  3. A complete checkpoint that does not fit the model (another architecture, width, dtype) is
//     an error naming the first parameter that does not fit, never a fallback: the load has
//     already overwritten part of the model, and an older file would not fit either.
//  4. Every rank must resume from the same step; if they do not, the directory is not shared
//     between the nodes, and the error says so.
//
// Under launch with checkpoints in memory (SessionOptions::checkpoint_memory, docs/checkpoints.md)
// every rank also keeps its own copy in launch's memory: save() is a memory copy on each rank
// (no collective), launch persists rank 0's copy to DIR in the background when the save is
// durable, and resume() takes the newest step every rank can read, from memory or from DIR,
// agreed over the process group (so rule 4 holds by construction).
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "common/checkpoint_format.h"
#include "worker/checkpoint_archive.h"

namespace ddpl::worker {

class Session;

struct CheckpointPolicy {
  std::string dir;      // empty: no checkpoints
  int keep = 2;         // newest complete checkpoints kept after each save (at least 1)
  bool resume = false;  // resume on a first start of a new job too (e.g. to train more epochs)
  bool memory = true;   // use launch's checkpoint memory when the session has it
};

struct CheckpointFile {
  int64_t step = 0;
  std::string path;
};

// Complete checkpoints are zip archives (LibTorch's format). Returns "" when `path` ends with a
// whole end-of-archive record whose central directory lies inside the file, else why not
// ("truncated: 1234 bytes, no end-of-archive record"). Cheap: reads at most the last 64 KiB.
std::string checkpointDefect(const std::string& path);

// The files and their bookkeeping, without collectives. Not thread-safe: use from one thread.
class CheckpointDirectory {
 public:
  static constexpr const char* kRunIdFile = "run_id";

  explicit CheckpointDirectory(std::string dir, int keep = 2);

  bool enabled() const { return !dir_.empty(); }
  const std::string& dir() const { return dir_; }
  std::string pathFor(int64_t step) const;
  // Checkpoint files by name, newest step first, whether complete or not. A writer killed
  // mid-write leaves only a ".tmp.<pid>" file, which never matches.
  std::vector<CheckpointFile> list() const;
  // The newest complete checkpoint, if any; `skipped` receives "PATH: defect" for every newer
  // file passed over.
  bool newestComplete(CheckpointFile& out, std::vector<std::string>* skipped = nullptr) const;
  void removeTemporaries() const;
  // Keeps the newest `keep` files; returns how many it removed.
  size_t prune() const;
  size_t removeAll() const;
  std::string storedRunId() const;
  void storeRunId(const std::string& id) const;

 private:
  std::string dir_;
  int keep_;
};

enum class ResumeReason { kFresh, kResumeFlag, kRestart, kSameRun };

// Step 1 of the rule, pure: what a start with these facts does.
ResumeReason chooseResume(int restartCount, const std::string& runId,
                          const std::string& storedRunId, bool resumeFlag);

struct ResumePoint {
  ResumeReason reason = ResumeReason::kFresh;
  std::string reason_text;  // "restart 2", "run JOB started again", "--resume"; empty when fresh
  std::string path;        // the checkpoint loaded; empty: none (starts at step 0)
  std::string source;      // "memory", "peer replica" (another node's copy) or "disk"; empty: none
  TrainingProgress progress;                  // as saved in it (zeros when none)
  std::vector<std::string> skipped_truncated;  // "PATH: why", newest first (every rank)
  size_t removed_stale = 0;  // a new job: the earlier run's checkpoints removed (rank 0's count)
};

// The policy over a Session: collective calls (every rank calls them, in the same order).
class CheckpointManager {
 public:
  CheckpointManager(Session& session, CheckpointPolicy policy);

  bool enabled() const { return dir_.enabled(); }
  const CheckpointDirectory& directory() const { return dir_; }
  // Saves go to launch's checkpoint memory (this rank's directory in it).
  bool inMemory() const { return !rank_dir_.empty(); }

  // Decides (rank 0, then shared by an all-reduce), finds the newest complete checkpoint and
  // loads it into `refs` on every rank, checks that every rank resumes at the same step.
  // Throws ddpl::InvalidArgument (rule 3) or ddpl::Error (rule 4). Logs nothing: the caller
  // reports the ResumePoint (skipped truncated files, removed stale ones) in its own words.
  ResumePoint resume(const CheckpointRefs& refs);

  // Rank 0 writes ckpt-step<progress->step>.pt atomically, all ranks meet at a barrier, rank 0
  // prunes to `keep`. `refs.progress` must be set. Returns the path.
  // In memory: every rank commits its copy (a memory copy, no collective); launch persists
  // rank 0's to DIR when `durable`, and after a worker died. A copy over the memory budget is
  // written to DIR by rank 0 instead, with a warning naming the sizes. Returns where the
  // checkpoint can be read now (in memory: launch's copy; latestDurable() names DIR's).
  std::string save(const CheckpointRefs& refs, bool durable = true);

  // The checkpoint last written or resumed from; empty when none. Thread-safe (a cleanup hook
  // on the signal thread reads it while training writes).
  std::string latest() const;
  // The newest durable one by its place in DIR: the same as latest() without launch's memory;
  // in memory, where launch persists the last durable save (there once launch has exited).
  std::string latestDurable() const;

 private:
  std::string memoryFileName(int64_t step) const;
  // This rank's run and (epoch, round), for the fence (common/checkpoint_files.h FenceGuard).
  ckpt::FenceToken fenceToken() const;
  void resumeAgreed(const CheckpointRefs& refs, ResumePoint& point);
  std::string saveInMemory(const CheckpointRefs& refs, bool durable);

  Session& session_;
  CheckpointPolicy policy_;
  CheckpointDirectory dir_;
  std::string
      rank_dir_;  // this rank's directory in launch's memory (made by the first save); empty: none
  bool warned_budget_ = false;
  mutable std::mutex mu_;
  std::string latest_, latest_durable_;
};

}  // namespace ddpl::worker
