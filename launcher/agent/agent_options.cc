#include "launcher/agent/agent_options.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <string>

#include "common/defaults.h"
#include "common/log.h"

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

}  // namespace ddpl::launcher
