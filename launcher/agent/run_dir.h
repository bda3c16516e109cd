#pragma once
// The run's folder on disk: created private and never an earlier run's, and what of it stays
// when launch removes its temporary log folder at exit.
#include <functional>
#include <string>
#include <vector>

#include "common/environment.h"
#include "launcher/cli/options.h"

namespace ddpl::launcher {

// Where runs' folders go: --log-dir (made when missing; InvalidArgument when it cannot be), or
// without it a new private temporary folder, which launch removes at exit.
struct LogBase {
  std::string path;
  bool temporary = false;
};
// `temp_parent`: where the temporary folder goes (temporaryLogParent).
LogBase makeLogBase(const std::string& log_dir, const std::string& temp_parent);

// Where a temporary log folder goes: TMPDIR when the user set it; else, when the run writes only
// small files there (`small_files_only`: no --redirects, --tee or duplicate filters, so error
// files, stacks and sockets), a memory file system of the user's own ($XDG_RUNTIME_DIR, else
// /dev/shm); else /tmp. On a disk file system the folders of a run (one per rank and attempt)
// and their removal at exit cost more than all the rest of launch's start and exit together
// (issue 44: 29 ms against 14 ms on tmpfs, 4 workers on a loaded 2-core machine); logs never go
// to memory, where a chatty worker would take what NCCL's and the checkpoints' shared memory
// need. `is_tmpfs` is asked of a candidate folder (a test passes its own).
std::string temporaryLogParent(const Environment& env, bool small_files_only,
                               const std::function<bool(const std::string&)>& is_tmpfs = {});
// Nothing of the run's output goes to files (no --redirects, --tee or duplicate filters).
bool writesOnlySmallFiles(const LaunchOptions& o);

// The agent could not start: nothing of the run stays (the temporary folder, or the run's in
// --log-dir; `run_dir` empty when it was not made yet).
void removeAfterFailedStart(const LogBase& base, const std::string& run_dir);

// At exit: the temporary folder goes, but for the `evidence` (keepOnlyEvidence); --log-dir's
// run stays whole.
void removeTemporaryBase(const LogBase& base, const std::string& run_dir,
                         const std::vector<std::string>& evidence);

// Creates BASE/RUN_ID (or a numbered sibling when that exists) and returns it.
std::string makeRunDir(const std::string& base, const std::string& run_id);

// The folders from `base` (the run directory) down to `dir`, none readable by others: they
// hold logs and error files, which may show the environment (issue 33).
void makePrivateDirs(const std::string& base, const std::string& dir);

// Removes everything under `log_base` but the run's manifest and the `evidence` (files, or
// folders with all they hold), then the folders left empty.
void keepOnlyEvidence(const std::string& log_base, const std::string& run_dir,
                      const std::vector<std::string>& evidence);

// A rank's log file under the run folder (O_NOFOLLOW, private to the user and group); throws
// ddpl::Error naming it.
int openRankLog(const std::string& path);

}  // namespace ddpl::launcher
