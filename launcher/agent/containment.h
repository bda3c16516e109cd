#pragma once
// Keeping every process a run starts within reach, whatever it does (setsid, double forks, an
// emptied environment). Two mechanisms:
// - RunCgroup: a cgroup v2 of the run's own, joined by each worker between fork and exec; all
//   descendants stay in it, and cgroup.kill ends them at once. Used where the machine has a
//   writable cgroup v2 (a VM, a systemd user session with delegation, a privileged container).
// - Without it: launch is the children's subreaper, so every orphaned descendant becomes its
//   child; childrenOf() finds them for the final sweep and for the watchdog.
#include <sys/types.h>

#include <functional>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "launcher/agent/watchdog.h"

namespace ddpl::launcher {

// The run's cgroup holds one leaf per attempt (attempt-<n>): workers start in the current leaf,
// and a restart kills only the old leaf. A cgroup once killed is never started into again: on
// this project's kernel (6.18) every child that clone3 starts into a cgroup after a write to its
// cgroup.kill is killed at birth.
class RunCgroup {
 public:
  // Creates <cgroup2 mount>/<this process's cgroup>/<name> and its first attempt's leaf.
  // Returns null and sets `why_not` when there is no writable cgroup v2 here.
  static std::unique_ptr<RunCgroup> create(const std::string& name, std::string* why_not);
  ~RunCgroup();  // kills what is left and removes the directories (bounded)
  RunCgroup(const RunCgroup&) = delete;
  RunCgroup& operator=(const RunCgroup&) = delete;

  const std::string& path() const { return path_; }  // the whole run
  // The current attempt's leaf, open (O_DIRECTORY, close-on-exec): where clone3 starts a
  // child. -1 when the leaf could not be made: children then join through procsFd().
  int dirFd() const { return dir_fd_; }
  // The current leaf's cgroup.procs, open for writing, close-on-exec: a forked child joins
  // with write(fd, "0", 1), which is async-signal-safe.
  int procsFd() const { return procs_fd_; }
  // SIGKILLs every process of the current attempt, then moves on to a fresh leaf for the next.
  void killAttempt();
  // SIGKILLs every process of the run (cgroup.kill, or one by one before Linux 5.14).
  void killAll();

 private:
  explicit RunCgroup(std::string path) : path_(std::move(path)) {}
  bool openLeaf();
  void closeLeaf();
  std::string path_;
  int attempt_ = 0;
  std::string leaf_;
  int dir_fd_ = -1;
  int procs_fd_ = -1;
};

// Kills every member of the cgroup at `path` (cgroup.kill where the kernel has it). Usable in
// the watchdog after fork: no allocation beyond the path string built before.
int killCgroup(const std::string& path);

// Removes a killed run cgroup: its attempt leaves first, then itself, waiting (at most
// `max_wait_ms`) for their members to be gone.
void removeCgroupTree(const std::string& path, int max_wait_ms = 2000);

// Run cgroups are named kRunCgroupPrefix + "<run id>-<launch pid>", beside launch's own cgroup.
inline constexpr const char* kRunCgroupPrefix = "ddpl-";

// A launch killed with SIGKILL (the whole tree at once: no watchdog left to clean up) leaves its
// run cgroup behind. Removes, beside this process's cgroup, those of ours whose launch is gone
// (its pid not running, or running a program that is not launch) and that hold no process, at
// most `max_remove` of them; never `keep` (the caller's own). Returns how many went.
int removeStaleRunCgroups(const std::string& keep, int max_remove = 4096);

// Removes the run's cgroup (killing what is left in it), then those that launches killed whole
// left (SIGKILL to launch, workers and watchdog at once: nothing else ever removes them).
void retireRunCgroup(std::unique_ptr<RunCgroup> cgroup);

// Live processes whose parent is `parent` (from /proc/<pid>/stat), zombies excluded.
std::vector<pid_t> childrenOf(pid_t parent);

// A process's start time in clock ticks since boot (/proc/<pid>/stat field 22), or 0 when it
// is gone: pid plus start time names a process even after its pid is reused.
unsigned long long processStartTime(pid_t pid);

// User plus system CPU seconds a process has used (/proc/<pid>/stat), 0 when it is gone.
double processCpuSeconds(pid_t pid);

// The same for a process and its descendants (those forked by each one's main thread), with the
// time of children already waited for, at most `max_processes` of them: a rank whose DataLoader
// workers compute while its main process waits is not idle.
double processTreeCpuSeconds(pid_t root, int max_processes = 256);
// Resident memory of a process in bytes; -1 when it is gone.
int64_t processRssBytes(pid_t pid);

// The run's leftovers for the agent: what it started besides its workers, found and killed.
// Without a cgroup, a periodic scan finds the orphaned descendants that became launch's
// children (strays) and tells the watchdog of each; at the end of an attempt or of the run,
// kill() ends every leftover, wherever it went.
//
// Threads: the agent's loop thread.
class Leftovers {
 public:
  explicit Leftovers(Watchdog& watchdog) : watchdog_(watchdog) {}

  // launch's children but the watchdog and `ours` (the live workers, the warm template).
  std::vector<pid_t> strays(const std::vector<pid_t>& ours) const;
  // Tells the watchdog of each stray not told before.
  void scan(const std::vector<pid_t>& ours);
  // SIGKILLs the run's processes but `ours`: those in `cgroup` (null: none; the current
  // attempt's leaf, or with `whole_run` the whole run), those carrying the watchdog's marker
  // but `spare` (the template, which carries it for the workers it forks), and the strays.
  // Between attempts only the finished attempt's leaf goes (the next starts in a new one).
  void kill(RunCgroup* cgroup, bool whole_run, pid_t spare, const std::vector<pid_t>& ours);
  // A new attempt: the strays told so far were killed with the last one.
  void forget() { told_.clear(); }
  // At the end of the run, after the workers' groups were killed: reaps every child of launch,
  // as its subreaper. While anything is left it is killed (kill(), whole run): a process that
  // escaped the workers' groups (setsid) and its environment (no marker) is in the cgroup, or
  // became launch's child when its parent died; again on every round, as double forks hand
  // launch new orphans. Bounded: 5 s, each wait for a child (`await_child(ms)`) 50 ms at most.
  void reapAll(RunCgroup* cgroup, pid_t spare, const std::vector<pid_t>& ours,
               const std::function<void(int ms)>& await_child);

 private:
  Watchdog& watchdog_;
  std::set<pid_t> told_;  // strays the watchdog knows (a pid each: bounded by the processes)
};

}  // namespace ddpl::launcher
