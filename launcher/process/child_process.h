#pragma once
// Child processes of launch's own, started in one place that knows fork's rules (only
// async-signal-safe calls until exec), launch's signal state (a mask blocked for the signalfd,
// SIGPIPE ignored: both survive exec) and how to leave nothing behind.
//
// runChild is the bounded form for tools (ldd, git, `python -c`, py-spy): argv without a shell,
// output captured up to a bound, and at the deadline the child's whole process group killed and
// the child reaped. Every descriptor it opens is O_CLOEXEC and closed before it returns.
//
// Threads: any. It reaps only the pids it started (never waitpid(-1)); a caller that reaps with
// waitpid(-1) on another thread (the agent's loop) must not run it at the same time. If that
// happens anyway, the child's end is still noticed (no wait for the deadline), nothing is sent
// to its pid any more (it may have been reused) and its exit status reads as unknown (-1).
#include <sys/types.h>

#include <cstddef>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace ddpl::launcher {

enum class ProcessGroup {
  kInherit,     // stays in launch's group (a terminal's ^C reaches it too)
  kNew,         // its own group, so that killing the group reaches what it started
  kNewSession,  // its own session: out of reach of the terminal and of launch's group
};

// What the child does between fork and exec.
struct ChildSetup {
  ProcessGroup group = ProcessGroup::kNew;
  // PR_SET_PDEATHSIG: sent to the child when launch dies. A child whose parent died before the
  // prctl exits 127 at once (the getppid race).
  int death_signal = 0;
  // The signal mask is always cleared. Then: every signal back to SIG_DFL, or these only, and
  // these ignored.
  bool all_signals_default = false;
  std::vector<int> default_signals;
  std::vector<int> ignored_signals;
  // Closes every descriptor above 2 but `keep_fds`, also those someone opened without
  // O_CLOEXEC (a child that keeps a pipe of launch's open stops its reader seeing EOF).
  bool close_other_fds = false;
  std::vector<int> keep_fds;
};

// The child's side of `setup`, for spawners with needs of their own (the workers: cgroups,
// NUMA, terminals). Async-signal-safe. `parent`: getpid() before the fork.
void applyChildSetup(const ChildSetup& setup, pid_t parent);

// fork(); the child applies `setup`, runs `body` and exits with what it returns (a helper
// process of launch's own: the watchdog). Returns the pid, or -1 with errno set.
pid_t forkChild(const ChildSetup& setup, const std::function<int()>& body);

// Starts `argv` (argv[0] a path) with launch's environment and stdin, stdout and stderr on
// /dev/null, and returns at once: the pid, or -1 with errno set when it could not be started.
// Nothing waits for it: the caller or launch's subreaper loop reaps it.
pid_t startDetached(const std::vector<std::string>& argv, const ChildSetup& setup);

struct ChildRun {
  std::vector<std::string> argv;                // argv[0] is looked up in PATH when it holds no '/'
  std::optional<std::vector<std::string>> env;  // "NAME=value" each; nullopt: launch's own
  std::optional<std::string> input;             // its stdin; nullopt: /dev/null
  enum class Stderr { kCapture, kIntoStdout, kDiscard };
  Stderr stderr_to = Stderr::kCapture;        // kIntoStdout keeps the two streams' order
  size_t max_output_bytes = size_t{1} << 20;  // kept per stream; the rest is read and dropped
  double timeout_sec = 60;
  ChildSetup setup = defaultSetup();

  // Its own group (the deadline kills all it started), SIGPIPE as a shell leaves it, no
  // descriptor of launch's but 0-2.
  static ChildSetup defaultSetup();
};

struct ChildResult {
  bool started = false;  // false: it never ran (see `error`)
  int exec_errno = 0;    // when exec failed
  std::string error;
  bool timed_out = false;  // killed at the deadline, with its group
  int exit_code = -1;      // when it exited
  int term_signal = 0;     // when a signal ended it
  std::string out, err;
  bool out_truncated = false, err_truncated = false;

  // As a shell says it: -1 not run, 124 timed out, the exit code, or 128 + the signal.
  int status() const;
};

ChildResult runChild(const ChildRun& run);
// Several at once, each with its own deadline (the stacks of every rank at the same time).
std::vector<ChildResult> runChildren(const std::vector<ChildRun>& runs);

}  // namespace ddpl::launcher
