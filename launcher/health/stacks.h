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
  std::string tool;      // the command that produced `text`, or "" when none could run
  std::string text;      // what it printed, or why there is nothing
  bool stopped = false;  // stopped (SIGSTOP, a debugger) when its stack was taken
};

// Whether the process is stopped now (SIGSTOP, a debugger): /proc/PID/stat's state.
bool processStopped(pid_t pid);

struct StackTools {
  std::string py_spy;    // empty: not found
  std::string eu_stack;  // empty: not found
  std::string gdb;       // empty: not found
};

// py-spy beside `python` (a venv's bin/) or on PATH; eu-stack and gdb on PATH.
StackTools findStackTools(const std::string& python, const std::string& path_env);

// One snapshot per (local rank, pid), taken concurrently; `python`: the workers run Python.
// A stopped process is read without py-spy's pause (--nonblocking), which fails on it ("Failed
// to suspend process"); stopped, it cannot change under the reader anyway.
std::vector<StackSnapshot> snapshotStacks(const std::vector<std::pair<int, pid_t>>& workers,
                                          bool python, const StackTools& tools, double timeout_sec);

struct StackFrame {
  std::string text;    // as the tool printed it: "all_reduce (torch/distributed/...py:2942)"
  bool user = false;   // the program's own code (markProgramFrames), not torch's or Python's
  std::string source;  // the program's frames: the line's text, trimmed, when it could be read
};

// What a report shows of a stack: the innermost frames of the process's main thread, and
// whether it is inside a collective (waiting for a peer) rather than somewhere of its own.
struct StackSummary {
  std::vector<std::string> innermost;  // at most `frames`, innermost first
  bool in_collective = false;          // hang_report.h's collectiveOf found one
  std::vector<StackFrame> frames;      // every frame of the main thread, innermost first
  bool stopped = false;                // StackSnapshot::stopped
};
StackSummary summarizeStack(const std::string& text, pid_t pid, size_t frames = 5);

// Marks the frames of the program's own files, and reads their lines' text. py-spy names a
// file from the outermost folder without an __init__.py down ("torch/distributed/x.py",
// "threading.py", "train.py"): a frame is the program's when that name is a file under
// `script_dir` (the script's folder, where Python looks for its modules first). Reads at most
// the first kMaxSourceBytes of each file.
inline constexpr size_t kMaxSourceBytes = 1 << 20;
void markProgramFrames(StackSummary& summary, const std::string& script_dir);
// The folder of the script a Python process runs, from its command line (the first argument
// that is not an interpreter option; relative to its working directory), or its working
// directory (python -m, -c); "" when /proc cannot tell.
std::string scriptDirOf(pid_t pid);

// Whether a worker command runs Python, so that its stacks are taken with py-spy (Python
// frames): an interpreter (python, python3, python3.11, any path) or a .py file run directly.
bool runsPython(const std::vector<std::string>& command);

}  // namespace ddpl::launcher
