#pragma once
// What the agent says when a run ends and when a group fails: the end-of-run summary (the
// stragglers judged once more on the final steps, where each restart's time went, the incident
// table, the per-rank table for the log and the dashboard), the root cause among the attempt's
// failures and the one paragraph the other nodes' reports quote, and the hint for workers that
// could not import torch. Functions of what the loop hands them: they log and return text, and
// change nothing of the loop's but the judgements they are handed (ProgressTracker,
// RestartClock).
//
// Threads: the agent's loop thread.
#include <string>
#include <vector>

#include "common/environment.h"
#include "launcher/agent/error_report.h"
#include "launcher/agent/supervisor.h"
#include "launcher/agent/worker_state.h"
#include "launcher/health/heartbeat_channel.h"
#include "launcher/health/progress.h"
#include "launcher/warm/restart_phases.h"

namespace ddpl::launcher {

// The OMP_NUM_THREADS the workers ran with, for the table: launch's own when set, else 1 where
// launch set it (several workers), else 0 (unknown).
int workerThreads(const Environment& base_env, int nproc);

// Logs the end-of-run summary of attempt `attempt` on `host` and returns it for the dashboard;
// "" where the log shows no table (no ranks, or a level above info).
std::string logRunSummary(ProgressTracker& progress, warm::RestartClock& restarts,
                          const std::string& host, int attempt, int threads, double now);

// The incident table (warm::RestartClock::incidentTable), the run's wall time counted from its
// first group's start: the end-of-run log and the dashboard show this same text.
std::string incidentText(const warm::RestartClock& restarts, double now,
                         size_t max_rows = warm::RestartClock::kMaxKept);

// The incident table's cause for a hang: the ranks that made no step (the culprit is named
// later, by the hang's report), four at most; `rank_offset`: this node's first global rank.
std::string hangCause(const std::vector<Hang>& hangs, int rank_offset);

// The current group's heartbeats, by local rank, for the incident table.
std::vector<warm::RankSteps> rankSteps(const HeartbeatChannels& heartbeats,
                                       const std::vector<WorkerState>& workers);

// The failure that the supervisor names the root cause (`root`), among `failures`; null when
// none is.
const FailureDetail* rootDetail(const WorkerExit* root, const std::vector<FailureDetail>& failures);

// One paragraph for the other nodes' reports: the root cause, or only the host without one.
std::string failureSummary(const FailureDetail* root, const std::string& host);

// When the root cause is Python's "No module named 'torch'" and launch chose the interpreter
// (`python_origin`: "/path/python3 (why)"), says which interpreter and what to do.
void hintAtMissingTorch(const FailureDetail& root, const std::string& python_origin);

}  // namespace ddpl::launcher
