#pragma once
// Starting worker processes so that none outlives the launcher: each in its own process group,
// with PR_SET_PDEATHSIG (and the getppid race closed), signal state reset, output on pipes.
#include <sys/types.h>

#include <string>
#include <vector>

namespace ddpl::launcher {
namespace warm {
class WorkerTemplate;
}

struct SpawnedProcess {
  pid_t pid = -1;      // also the process group id
  int stdout_fd = -1;  // read ends: a pipe, or a terminal's master side (EIO at its end)
  int stderr_fd = -1;
  int exec_status_fd = -1;  // closes on successful exec; carries errno when exec failed
};

// What the child gets besides the defaults.
struct SpawnOptions {
  // Start in that cgroup (RunCgroup::dirFd, clone3's CLONE_INTO_CGROUP), else join it between
  // fork and exec through its procs file (RunCgroup::procsFd); -1: stay.
  int cgroup_dir_fd = -1;
  int cgroup_procs_fd = -1;
  int inherit_fd = -1;         // stays open across exec, same number (the heartbeat memfd)
  std::vector<int> cpus;       // bind to these CPUs; empty: inherit
  std::vector<int> mem_nodes;  // allocate memory on these NUMA nodes only; empty: default
  // A pseudo-terminal instead of a pipe for the stream, of this many columns and rows (as
  // torchrun's workers, which write to the console itself when it is a terminal, see one).
  bool stdout_terminal = false;
  bool stderr_terminal = false;
  unsigned short columns = 80, rows = 24;
};

// argv[0] must be a path (resolveCommand gives one). Never throws after fork; a failed exec is
// reported by awaitExec. Pipes are non-blocking and close-on-exec on the launcher's side.
SpawnedProcess spawnProcess(const std::vector<std::string>& argv,
                            const std::vector<std::string>& envp, const SpawnOptions& options = {});

// The same worker forked from the warm template (launcher/warm/worker_template.h) instead, with
// the same streams, heartbeat, cgroup and CPUs (not `mem_nodes`: warm_plan.h keeps such workers
// cold). pid -1 and `why` when the template could not: the caller starts the worker cold.
// `heartbeat_env`: the variable that names the heartbeat descriptor (its number changes).
SpawnedProcess spawnFromTemplate(warm::WorkerTemplate& tmpl, const std::vector<std::string>& argv,
                                 const std::vector<std::string>& envp,
                                 const std::string& heartbeat_env, const SpawnOptions& options,
                                 double timeout_sec, std::string* why);

// Waits for the child's exec to succeed or fail (bounded: exec either happens or fails within
// the child's first instructions). Returns 0 on success or the errno of the failed exec.
int awaitExec(SpawnedProcess& p);

// Makes this process a subreaper, so orphaned grandchildren are reparented to us and reaped.
void becomeSubreaper();

}  // namespace ddpl::launcher
