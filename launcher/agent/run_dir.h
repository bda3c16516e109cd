#pragma once
// The run's folder on disk: created private and never an earlier run's, and what of it stays
// when launch removes its temporary log folder at exit.
#include <string>
#include <vector>

namespace ddpl::launcher {

// Where runs' folders go: --log-dir (made when missing; InvalidArgument when it cannot be), or
// without it a new private temporary folder, which launch removes at exit.
struct LogBase {
  std::string path;
  bool temporary = false;
};
LogBase makeLogBase(const std::string& log_dir);

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

}  // namespace ddpl::launcher
