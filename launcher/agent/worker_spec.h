#pragma once
// What each worker runs and the environment it gets: pure functions over the options and the
// world assignment (tests/unit/worker_spec_test.cc checks them variable by variable).
#include <map>
#include <string>
#include <vector>

#include "common/environment.h"
#include "launcher/cli/options.h"
#include "launcher/membership/rendezvous_handler.h"

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
};

// The torchrun environment for one worker, layered over `base` (the launcher's own
// environment, which workers inherit). `extra` is added last (store endpoint and the like).
Environment buildWorkerEnv(const Environment& base, const WorldAssignment& world,
                           const WorkerContext& worker, const Environment& extra = {});

std::vector<std::string> toEnvp(const Environment& env);

}  // namespace ddpl::launcher
