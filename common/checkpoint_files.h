#pragma once
// The memory checkpoint tier's file operations (docs/checkpoints.md), shared by launch's agent
// and the C++ worker library so that both read and write the one format: begin and commit a
// step, list the valid committed ones, persist a step to its durable place with its marker, and
// durable retention. Every function throws ddpl::Error naming the path and errno on failure.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/checkpoint_format.h"
#include "common/errors.h"

namespace ddpl::ckpt {

// A write from a round older than the newest that committed to the directory (fenceRefuses).
class StaleRoundError : public Error {
 public:
  using Error::Error;
};

// Held across a commit into `dir`: takes `dir`/.ddpl-fence's lock (flock, waiting at most
// `timeout_sec`), refuses (StaleRoundError naming both rounds and `what`) when a newer round of
// the same run committed there, else records `mine` as the newest. Nothing when `mine` is not
// known. The lock orders writers on one machine and, where the file system supports flock
// (local, NFSv4), across machines; where it does not, the check still runs, unordered.
class FenceGuard {
 public:
  FenceGuard(const std::string& dir, const FenceToken& mine, const std::string& what,
             double timeout_sec = 60);
  ~FenceGuard();
  FenceGuard(const FenceGuard&) = delete;
  FenceGuard& operator=(const FenceGuard&) = delete;

 private:
  int fd_ = -1;
};

struct StoredStep {
  int64_t step = 0;
  std::string dir;  // where its files are (a memory step-<N>, or the durable path)
  CommitRecord record;
};

// The record of `step_dir` when it is a valid committed step of `rank` (the record parses,
// matches the names, and every listed file is a regular file of its size); else none, with
// the reason in `why` when given.
std::optional<CommitRecord> readCommitted(const std::string& step_dir, int64_t step, int64_t rank,
                                          std::string* why = nullptr);

// Valid committed steps in a memory rank directory, newest first.
std::vector<StoredStep> listCommitted(const std::string& rank_dir, int64_t rank);
// Bytes the committed steps in a rank directory hold, valid or not, and the partial ones.
struct RankUsage {
  uint64_t committed = 0;
  uint64_t partial = 0;
};
RankUsage rankUsage(const std::string& rank_dir);

// The memory root and a rank's directory in it are made by the first write (the worker's
// begin), not by launch, so that a job that never checkpoints has none (docs/checkpoints.md).
// Creates `dir` (0700) unless it exists; either way it must then be a real directory (not a
// symlink) of this user that nobody else can enter: a root another user made first under the
// name is refused (ddpl::Error naming its owner and mode), never written into.
void makePrivateDir(const std::string& dir);
// makePrivateDir of `root`, then of `root`/rank-<rank>; returns the latter.
std::string makeRankDir(const std::string& root, int64_t rank);

// Removes this process's partial directories and makes partial-<step>-<pid>; returns its path.
std::string beginStep(const std::string& rank_dir, int64_t step);

// Lists the partial directory's files into `record` (step, rank, files, bytes and time are
// filled here), writes the record and renames the directory to step-<N> (replacing an earlier
// one of that step). Refuses symlinks and anything but regular files and directories. Returns
// the committed directory.
std::string commitStep(const std::string& rank_dir, const std::string& partial,
                       CommitRecord& record);

// Removes committed steps beyond the newest `keep` (at least 1 stays), never `just_committed`
// (a run resumed from an earlier step may find later steps of its earlier attempt).
void trimCommitted(const std::string& rank_dir, int64_t keep, int64_t just_committed = -1);
// Removes partial directories whose writer `pid` is given, or all when pid is 0.
void removePartials(const std::string& rank_dir, long pid = 0);

// Persists a committed step: removes an earlier marker of the step and rank, copies each file to
// record.durable_path/<rel> (temporary, fsync, rename), then writes the marker. `move`: rename the
// files instead of copying them (the step directory is on the same file system: the worker's path
// without launch). Returns the bytes written.
uint64_t persistStep(const std::string& step_dir, const CommitRecord& record, bool move);

// The directory that holds a durable path's steps: <dir> for <dir>/step-<N>, else itself.
std::string durableRoot(const CommitRecord& record);
// Steps persisted under `dir` that `rank` can read (its own marker, or rank 0's for a
// replicated step), their files present with their sizes; newest first. Markers count in `dir`
// (flat) and in `dir`/step-<N>/ (step N's only); per step, the rank's own before rank 0's, a
// step's directory before the flat one.
std::vector<StoredStep> listDurable(const std::string& dir, int64_t rank);
// Durable retention for `rank` under `dir`: removes the markers and then the files of its
// persisted steps older than the newest `keep` (0: keeps all), but a file that a kept step of the
// rank lists. Returns how many markers went.
size_t retireDurable(const std::string& dir, int64_t rank, int64_t keep);

}  // namespace ddpl::ckpt
