#pragma once
// The failure summary torchrun users know ("Root Cause (first observed failure)"), filled from
// the workers' error files (torchrun's JSON) or, when a program wrote none, from the last lines
// of its stderr: never a bare "error_file: <N/A>".
#include <deque>
#include <optional>
#include <string>
#include <vector>

#include "launcher/agent/supervisor.h"

namespace ddpl::launcher {

struct ErrorFileContents {
  std::string message;    // "ValueError: bad batch size"
  std::string traceback;  // Python or C++ call stack, as written
  std::string timestamp;  // unix seconds, as written
};

// Parses torchrun's error-file JSON. nullopt when the file is missing; a file that exists but
// cannot be parsed yields its raw text as the message (it may still say what went wrong).
std::optional<ErrorFileContents> readErrorFile(const std::string& path);

struct FailureDetail {
  WorkerExit exit;
  int global_rank = 0;
  std::string host;
  std::string error_file;
  bool error_file_kept = true;  // false under the temporary log directory launch removes at exit
  std::optional<ErrorFileContents> error;
  std::deque<std::string> stderr_tail;
};

// A worker's failure as the reports tell it: `exec_failed`, where its exec failed, else its
// error file (read now), and its last lines on stderr.
FailureDetail workerFailure(const WorkerExit& exit, int global_rank, const std::string& host,
                            const std::string& error_file, bool error_file_kept,
                            std::deque<std::string> stderr_tail,
                            const FailureDetail* exec_failed = nullptr);

// A C++ worker's trace is cut to its innermost frames past the exception's own construction;
// the error file keeps all of them.
inline constexpr size_t kReportFrames = 8;

std::string formatFailureReport(const std::string& program, const std::vector<FailureDetail>& all,
                                const FailureDetail& root);

}  // namespace ddpl::launcher
