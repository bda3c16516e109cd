#pragma once
// What the agent derives from its configuration before it starts anything: how the console
// is written, which signals stop the workers, the hang limits, the run's cgroup, and its
// parts' settings (the stacks service, the checkpoint keeper).
#include <signal.h>
#include <sys/ioctl.h>

#include <memory>
#include <optional>
#include <vector>

#include "launcher/agent/agent.h"
#include "launcher/agent/containment.h"
#include "launcher/agent/output.h"
#include "launcher/agent/process.h"
#include "launcher/agent/stacks_service.h"
#include "launcher/checkpoint/checkpoint_keeper.h"
#include "launcher/health/progress.h"

namespace ddpl::launcher {

// The console's size when both stdout and stderr are terminals (80x24 when it says none).
std::optional<winsize> terminalSize();
HangOptions hangOptions(const LaunchOptions& o);
ConsoleOptions consoleOptions(const LaunchOptions& o);
// What the agent's signalfd takes: SIGCHLD and `handled` (--signals-to-handle); blockSignals
// (agent.h) blocks the same set.
sigset_t agentSignals(const std::vector<int>& handled);
// The handled signals that stop the workers (the others are forwarded to them).
std::vector<int> stopSignals(const LaunchOptions& o);
// The run's cgroup, or null (--no-cgroup, or none the machine gives: said at debug level).
std::unique_ptr<RunCgroup> makeCgroup(const AgentConfig& c);
// How local rank `local_rank` (global rank `global_rank`) is spawned: in `cgroup` (null: none),
// with `heartbeat_fd` inherited, on its CPUs and memory nodes (--numa-binding), and on a
// terminal `console`, with terminals for the streams that reach it, narrower by the prefix.
SpawnOptions workerSpawnOptions(const AgentConfig& c, int local_rank, int global_rank,
                                const RankStreams& streams, const RunCgroup* cgroup,
                                int heartbeat_fd, const std::optional<winsize>& console);
// The stacks service's settings for the run in `run_dir` (all but its status line).
StacksService::Config stacksConfig(const AgentConfig& c, const std::string& run_dir);
// The checkpoint keeper's settings: --checkpoint-memory and its kin, where peers reach us.
CheckpointKeeperOptions checkpointOptions(const AgentConfig& c);

}  // namespace ddpl::launcher
