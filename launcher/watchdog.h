#pragma once
// Covers the one case the launcher cannot handle itself: its own SIGKILL. PDEATHSIG kills the
// workers, but not their children. The watchdog is a tiny forked process in its own session
// that holds the read end of a pipe; when the launcher dies the pipe closes and the watchdog
// SIGKILLs every worker process group and every process carrying this launch's marker in its
// environment (which catches grandchildren that left the group with setsid).
#include <sys/types.h>

#include <string>

namespace ddpl::launcher {

inline constexpr const char* kMarkerEnv = "DDPL_LAUNCH_ID";

class Watchdog {
 public:
  explicit Watchdog(std::string marker_value);
  ~Watchdog() { release(); }
  // Tells the watchdog the launcher finished cleanly and reaps it. Idempotent.
  void release();

  void watchGroup(pid_t pgid);
  void unwatchGroup(pid_t pgid);
  const std::string& marker() const { return marker_; }

 private:
  void send(char op, pid_t pgid);
  std::string marker_;
  int pipe_fd_ = -1;
  pid_t pid_ = -1;
};

// SIGKILLs every process (other than the caller) whose initial environment holds
// kMarkerEnv=marker. Returns how many were signalled.
int killMarkedProcesses(const std::string& marker);

}  // namespace ddpl::launcher
