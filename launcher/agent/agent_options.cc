#include "launcher/agent/agent_options.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <string>

#include "common/defaults.h"
#include "common/log.h"
#include "launcher/health/stacks.h"

namespace ddpl::launcher {

std::optional<winsize> terminalSize() {
  winsize ws{};
  if (!isatty(STDOUT_FILENO) || !isatty(STDERR_FILENO)) return std::nullopt;
  if (ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) != 0 || ws.ws_col == 0) ws = {24, 80, 0, 0};
  return ws;
}

HangOptions hangOptions(const LaunchOptions& o) {
  HangOptions h;
  h.timeout_sec = o.hang_timeout_sec;
  h.first_step_timeout_sec = o.hang_first_timeout_sec;
  h.finish_timeout_sec = o.hang_finish_timeout_sec;
  return h;
}

ConsoleOptions consoleOptions(const LaunchOptions& o) {
  ConsoleOptions c;
  c.out = STDOUT_FILENO;
  c.err = STDERR_FILENO;
  c.role = o.role;
  c.prefix_template = o.log_line_prefix_template;
  c.prefix = o.prefix_output;
  c.live = isatty(STDOUT_FILENO) && isatty(STDERR_FILENO);
  c.status_line = o.monitor == MonitorMode::kLive || (o.monitor == MonitorMode::kAuto && c.live);
  c.duplicate_stdout_filters = o.duplicate_stdout_filters;
  c.duplicate_stderr_filters = o.duplicate_stderr_filters;
  return c;
}

sigset_t agentSignals(const std::vector<int>& handled) {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGCHLD);
  for (int s : handled) sigaddset(&set, s);
  return set;
}

void blockSignals(const std::vector<int>& signals) {
  signal(SIGPIPE, SIG_IGN);
  sigset_t set = agentSignals(signals);
  sigprocmask(SIG_BLOCK, &set, nullptr);
}

std::vector<int> stopSignals(const LaunchOptions& o) {
  std::vector<int> out;
  for (int s : o.signals_to_handle)
    if (std::find(std::begin(defaults::kStopSignals), std::end(defaults::kStopSignals), s) !=
        std::end(defaults::kStopSignals))
      out.push_back(s);
  return out;
}

std::unique_ptr<RunCgroup> makeCgroup(const AgentConfig& c) {
  if (!c.options.use_cgroup) return nullptr;
  std::string name = kRunCgroupPrefix + c.run_id + "-" + std::to_string(getpid());
  for (char& ch : name)
    if (!isalnum(static_cast<unsigned char>(ch)) && ch != '-' && ch != '_' && ch != '.') ch = '_';
  std::string why;
  auto cg = RunCgroup::create(name, &why);
  if (cg)
    log::debug("workers run in cgroup {}: nothing they start can outlive the run", cg->path());
  else
    log::debug(
        "no cgroup for this run ({}): processes that leave their group and their "
        "environment are found as launch's orphaned children instead",
        why);
  return cg;
}

SpawnOptions workerSpawnOptions(const AgentConfig& c, int local_rank, int global_rank,
                                const RankStreams& streams, const RunCgroup* cgroup,
                                int heartbeat_fd, const std::optional<winsize>& console) {
  SpawnOptions so;
  so.cgroup_dir_fd = cgroup ? cgroup->dirFd() : -1;
  so.cgroup_procs_fd = cgroup ? cgroup->procsFd() : -1;
  so.inherit_fd = heartbeat_fd;
  if (local_rank < static_cast<int>(c.numa.size())) {
    so.cpus = c.numa[local_rank].cpus;
    so.mem_nodes = c.numa[local_rank].mem_nodes;
  }
  // On a terminal console, the streams that reach it are terminals too (progress bars,
  // colours and line buffering behave as under torchrun); narrower by the prefix.
  if (console) {
    const auto& o = c.options;
    so.stdout_terminal = streams.out_console;
    so.stderr_terminal = streams.err_console;
    std::string prefix =
        o.prefix_output ? expandPrefix(o.log_line_prefix_template, o.role, local_rank, global_rank)
                        : "";
    so.columns = static_cast<unsigned short>(
        std::max<int>(20, console->ws_col - static_cast<int>(prefix.size())));
    so.rows = console->ws_row;
  }
  return so;
}

StacksService::Config stacksConfig(const AgentConfig& c, const std::string& run_dir) {
  StacksService::Config sc;
  sc.run_dir = run_dir;
  sc.host = c.host;
  // launch added the interpreter, or the command names one (`launch --no-python python3 x.py`).
  sc.python = !c.python_origin.empty() || runsPython(c.command);
  sc.interpreter = c.command[0];
  auto path = c.base_env.find("PATH");
  sc.path_env = path == c.base_env.end() ? "" : path->second;
  sc.hang_timeout_sec = hangOptions(c.options).soonestLimitSec();
  return sc;
}

CheckpointKeeperOptions checkpointOptions(const AgentConfig& c) {
  const auto& o = c.options;
  CheckpointKeeperOptions co;
  co.memory = o.checkpoint_memory;
  co.keep = o.checkpoint_memory_keep;
  co.durable_dir = o.checkpoint_dir;
  co.nproc = c.nproc;
  co.advertised_host = o.local_addr.empty() ? c.host : o.local_addr;
  co.drain_timeout_sec = o.checkpoint_drain_timeout_sec;
  return co;
}

}  // namespace ddpl::launcher
