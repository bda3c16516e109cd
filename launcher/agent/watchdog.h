#pragma once
// Covers the one case the launcher cannot handle itself: its own SIGKILL. PDEATHSIG kills the
// workers, but not their children. The watchdog is a tiny forked process in its own session
// that holds the read end of a pipe; when the launcher dies the pipe closes and the watchdog
// SIGKILLs the run's cgroup when there is one (which holds every descendant, however it left),
// every worker process group, every process carrying this launch's marker in its environment
// (grandchildren that left the group with setsid), and the stray children the launcher told it
// of (descendants that also emptied their environment, found as the launcher's subreaper
// children).
#include <sys/types.h>

#include <string>

#include "common/defaults.h"

namespace ddpl::launcher {

inline constexpr const char* kMarkerEnv = envvar::kLaunchId;

class Watchdog {
 public:
  // `cgroup_path`: the run's cgroup (RunCgroup), empty when there is none.
  Watchdog(std::string marker_value, std::string cgroup_path);
  ~Watchdog() { release(); }
  // Tells the watchdog the launcher finished cleanly and reaps it. Idempotent.
  void release();

  // A directory of launch's own (its temporary run directory without --log-dir, the checkpoint
  // memory root; up to 8) that goes too when launch dies without finishing: a SIGKILLed launch
  // left one in /tmp each time.
  void removeOnDeath(const std::string& dir);
  void watchGroup(pid_t pgid);
  void unwatchGroup(pid_t pgid);
  // A process that is not a worker but became the launcher's child (an orphaned descendant);
  // `start_time` (processStartTime) keeps a reused pid from being killed.
  void watchStray(pid_t pid, unsigned long long start_time);
  const std::string& marker() const { return marker_; }
  pid_t pid() const { return pid_; }

 private:
  void send(const char* line, int len);
  std::string marker_;
  std::string cgroup_path_;
  int pipe_fd_ = -1;
  pid_t pid_ = -1;
};

// SIGKILLs every process (other than the caller and `spare`, the warm template that carries the
// marker for the workers it forks) whose initial environment holds kMarkerEnv=marker. Returns
// how many were signalled.
int killMarkedProcesses(const std::string& marker, pid_t spare = -1);

}  // namespace ddpl::launcher
