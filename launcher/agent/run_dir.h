#pragma once
// The run's folder on disk: created private and never an earlier run's, and what of it stays
// when launch removes its temporary log folder at exit.
#include <string>
#include <vector>

namespace ddpl::launcher {

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
