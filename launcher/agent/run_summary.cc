#include "launcher/agent/run_summary.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>

#include "common/log.h"
#include "common/torchrun_env.h"
#include "launcher/agent/numa.h"

namespace ddpl::launcher {

int workerThreads(const Environment& base_env, int nproc) {
  auto omp = base_env.find(torchrun_env::kOmpNumThreads);
  if (omp != base_env.end()) return std::atoi(omp->second.c_str());
  return nproc > 1 ? 1 : 0;  // what launch sets
}

std::string logRunSummary(ProgressTracker& progress, warm::RestartClock& restarts,
                          const std::string& host, int attempt, int threads, double now) {
  for (const auto& s : progress.newStragglers())  // judged once more on the final steps
    log::warn("straggler on {}: {}", host, s.describe());
  restarts.onGroupEnded(now);
  if (!restarts.completed().empty()) {
    log::info("where each restart's time went (from the failure to every rank's first step):{}",
              restarts.summary());
    log::info("{}", incidentText(restarts, now));
  }
  if (progress.ranks().empty() || !log::logger().should_log(spdlog::level::info)) return "";
  std::string table = progress.summary(now, usableCpus(), threads);
  log::info("per-rank summary of attempt {}:\n{}", attempt, table);
  // The incident table has a section of its own on the page.
  return fmt::format(
      "per-rank summary of attempt {}:\n{}{}", attempt, table,
      restarts.completed().empty() ? "" : "\nwhere each restart's time went:" + restarts.summary());
}

std::string incidentText(const warm::RestartClock& restarts, double now, size_t max_rows) {
  double wall = restarts.firstStarted() > 0 ? now - restarts.firstStarted() : 0;
  return restarts.incidentTable(wall, max_rows);
}

std::string hangCause(const std::vector<Hang>& hangs, int rank_offset) {
  std::string ranks;
  for (size_t i = 0; i < hangs.size() && i < 4; ++i)
    ranks += fmt::format("{}{}", i ? "," : "", rank_offset + hangs[i].local_rank);
  if (hangs.size() > 4) ranks += fmt::format(" +{} more", hangs.size() - 4);
  return fmt::format("hang: rank{} {} made no step", hangs.size() > 1 ? "s" : "", ranks);
}

std::vector<warm::RankSteps> rankSteps(const HeartbeatChannels& heartbeats,
                                       const std::vector<WorkerState>& workers) {
  std::vector<warm::RankSteps> out;
  for (const auto& w : workers)
    out.push_back({heartbeats.step(w.local_rank), heartbeats.restoredStep(w.local_rank),
                   warm::restoreSourceFromCode(heartbeats.restoreSource(w.local_rank))});
  return out;
}

const FailureDetail* rootDetail(const WorkerExit* root,
                                const std::vector<FailureDetail>& failures) {
  for (const auto& f : failures)
    if (root && f.exit.pid == root->pid) return &f;
  return nullptr;
}

std::string failureSummary(const FailureDetail* d, const std::string& host) {
  if (!d) return "a worker group failed on " + host;
  std::string s = "host " + host + ", rank " + std::to_string(d->global_rank) + " (local rank " +
                  std::to_string(d->exit.local_rank) + ", pid " + std::to_string(d->exit.pid) +
                  "): " + d->exit.status.describe();
  if (d->error)
    s += ": " + d->error->message;
  else if (!d->stderr_tail.empty())
    s += "; last stderr line: " + d->stderr_tail.back();
  return s;
}

namespace {

bool lacksTorch(const FailureDetail& d) {
  const std::string needle = "No module named 'torch'";
  if (d.error && d.error->message.find(needle) != std::string::npos) return true;
  return std::any_of(d.stderr_tail.begin(), d.stderr_tail.end(),
                     [&](const std::string& l) { return l.find(needle) != std::string::npos; });
}

}  // namespace

void hintAtMissingTorch(const FailureDetail& root, const std::string& python_origin) {
  if (!python_origin.empty() && lacksTorch(root))
    log::error(
        "the workers ran under {}, which cannot import torch: set PYTHON_EXEC to the "
        "interpreter that has it, or run the launch installed in that environment",
        python_origin);
}

}  // namespace ddpl::launcher
