#pragma once
// What each worker runs and the environment it gets: pure functions over the options and the
// world assignment (tests/unit/worker_spec_test.cc checks them variable by variable).
#include <map>
#include <string>
#include <vector>

#include "common/environment.h"
#include "launcher/cli/options.h"
#include "launcher/membership/membership.h"

namespace ddpl::launcher {

using Environment = ddpl::Environment;

// The command every worker runs before ${local_rank} substitution, e.g.
// {"/usr/bin/python3", "-u", "train.py", "--lr", "0.1"}. Checks that the program exists and can
// run, and throws UsageError with what to do otherwise.
std::vector<std::string> resolveCommand(const LaunchOptions& options, const Environment& env);

// The interpreter for a .py PROGRAM or -m: PYTHON_EXEC, else options.python, else python3 from
// PATH; `origin` (when given) says which and where. Throws UsageError when it is not found.
std::string pythonFor(const LaunchOptions& options, const Environment& env,
                      std::string* origin = nullptr);

// Replaces every "${local_rank}" in the arguments.
std::vector<std::string> substituteLocalRank(const std::vector<std::string>& command,
                                             int local_rank);

struct WorkerContext {
  int local_rank = 0;
  int local_world_size = 1;
  int restart_count = 0;
  int max_restarts = 0;
  std::string role = "default";
  std::string error_file;
  // --virtual-local-rank: LOCAL_RANK=0 and only this local rank's device visible.
  bool virtual_local_rank = false;
  // TORCHELASTIC_SIGNALS_TO_HANDLE, as torchrun 2.15 exports it ("SIGTERM,SIGINT"); empty: unset.
  std::string signals_to_handle;
};

// The context of local rank `local_rank` from the options (role, restarts, the flags above).
WorkerContext workerContext(const LaunchOptions& options, int local_rank, int local_world_size,
                            int restart_count, std::string error_file);

// --virtual-local-rank's device for a local rank, from launch's own environment `base`, as
// torchrun's: the local rank's entry of HIP_VISIBLE_DEVICES when that is set and not empty,
// else of CUDA_VISIBLE_DEVICES when set, else the local rank itself. Throws UsageError when
// the list has no entry for it.
std::string virtualDevice(const Environment& base, int local_rank);
// Throws virtualDevice's error for the first local rank of `nproc` without a device: checked
// once before any worker starts (torchrun finds it only while starting them).
void checkVirtualDevices(const Environment& base, int nproc);

// The torchrun environment for one worker, layered over `base` (the launcher's own
// environment, which workers inherit). `extra` is added last (store endpoint and the like).
Environment buildWorkerEnv(const Environment& base, const WorldAssignment& world,
                           const WorkerContext& worker, const Environment& extra = {});

std::vector<std::string> toEnvp(const Environment& env);

// Where local rank `local_rank`'s output goes: its files (--redirects, --tee) and the console
// (what is not redirected, or is teed, of the ranks --local-ranks-filter shows).
struct RankStreams {
  StreamSelection redirect, tee;
  bool out_console = false, err_console = false;
  bool outFile() const { return redirect.stdout_ || tee.stdout_; }
  bool errFile() const { return redirect.stderr_ || tee.stderr_; }
};
RankStreams rankStreams(const LaunchOptions& options, int local_rank);

}  // namespace ddpl::launcher
