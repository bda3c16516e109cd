#pragma once
// What the agent derives from its configuration before it starts anything: how the console
// is written, which signals stop the workers, the hang limits, the run's cgroup.
#include <sys/ioctl.h>

#include <memory>
#include <optional>
#include <vector>

#include "launcher/agent/agent.h"
#include "launcher/agent/containment.h"
#include "launcher/agent/output.h"
#include "launcher/health/progress.h"

namespace ddpl::launcher {

// The console's size when both stdout and stderr are terminals (80x24 when it says none).
std::optional<winsize> terminalSize();
HangOptions hangOptions(const LaunchOptions& o);
ConsoleOptions consoleOptions(const LaunchOptions& o);
// The handled signals that stop the workers (the others are forwarded to them).
std::vector<int> stopSignals(const LaunchOptions& o);
// The run's cgroup, or null (--no-cgroup, or none the machine gives: said at debug level).
std::unique_ptr<RunCgroup> makeCgroup(const AgentConfig& c);

}  // namespace ddpl::launcher
