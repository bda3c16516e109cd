#pragma once
// Stack snapshots of running workers, for hang reports (issue 18): py-spy for Python workers
// (Python frames), eu-stack or gdb for native ones. Each tool runs bounded by a timeout, all of
// them at once; a missing tool is reported in the snapshot's text, never as an error.
#include <sys/types.h>

#include <string>
#include <vector>

namespace ddpl::launcher {

struct StackSnapshot {
  int local_rank = 0;
  pid_t pid = 0;
  std::string tool;  // the command that produced `text`, or "" when none could run
  std::string text;  // what it printed, or why there is nothing
};

struct StackTools {
  std::string py_spy;    // empty: not found
  std::string eu_stack;  // empty: not found
  std::string gdb;       // empty: not found
};

// py-spy beside `python` (a venv's bin/) or on PATH; eu-stack and gdb on PATH.
StackTools findStackTools(const std::string& python, const std::string& path_env);

// One snapshot per (local rank, pid), taken concurrently; `python`: the workers run Python.
std::vector<StackSnapshot> snapshotStacks(const std::vector<std::pair<int, pid_t>>& workers,
                                          bool python, const StackTools& tools, double timeout_sec);

// What a report shows of a stack: the innermost frames of the process's main thread, and
// whether it is inside a collective (waiting for a peer) rather than somewhere of its own.
struct StackSummary {
  std::vector<std::string> innermost;  // at most `frames`, innermost first
  bool in_collective = false;
};
StackSummary summarizeStack(const std::string& text, pid_t pid, size_t frames = 5);

// Whether a worker command runs Python, so that its stacks are taken with py-spy (Python
// frames): an interpreter (python, python3, python3.11, any path) or a .py file run directly.
bool runsPython(const std::vector<std::string>& command);

}  // namespace ddpl::launcher
