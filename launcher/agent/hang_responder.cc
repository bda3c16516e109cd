#include "launcher/agent/hang_responder.h"

#include <algorithm>
#include <memory>

#include "common/log.h"
#include "launcher/agent/containment.h"

namespace ddpl::launcher {

std::string HangResponder::stacksFile(int local_rank) const {
  return attempt_dir_ + "/" + std::to_string(local_rank) + "/stacks.txt";
}

int HangResponder::globalRank(int local_rank) const {
  return workers_[static_cast<size_t>(local_rank)].global_rank;
}

std::string HangResponder::begin(const std::vector<Hang>& hangs, double now,
                                 std::vector<WorkerState> workers, std::string attempt_dir,
                                 int group_rank, const ProgressTracker& progress,
                                 web::MetricsEndpoint* metrics) {
  busy_ = true;
  hangs_ = hangs;
  now_ = now;
  workers_ = std::move(workers);
  attempt_dir_ = std::move(attempt_dir);
  outside_.clear();
  for (const auto& h : hangs) {
    log::error("rank {} (local rank {}) is hung: {}", globalRank(h.local_rank), h.local_rank,
               h.why);
    if (metrics) metrics->onHang(globalRank(h.local_rank), h.local_rank);
  }
  std::string steps;
  for (const auto& r : progress.ranks())
    steps += fmt::format("{}rank {}: {}", steps.empty() ? "" : ", ", r.global_rank,
                         r.first_beat ? "step " + std::to_string(r.step) : "no step reported");
  log::error("last step of each rank: {}", steps);
  std::string names;
  for (const auto& h : hangs)
    names += (names.empty() ? "" : ", ") + std::to_string(globalRank(h.local_rank));
  return fmt::format("hang: rank(s) {} on node {} ({})", names, group_rank, host_);
}

void HangResponder::onStacksSaved(const HangStacks& stacks) {
  const auto& summary = stacks.summaries;
  for (const auto& [lr, st] : summary)
    if (!st.in_collective && !st.innermost.empty()) outside_.push_back(lr);
  if (!outside_.empty() && outside_.size() < summary.size()) {
    std::string names;
    for (int lr : outside_) names += (names.empty() ? "" : ", ") + std::to_string(globalRank(lr));
    log::error(
        "likely culprit: rank(s) {} (not inside a collective while the others wait in "
        "one)",
        names);
  }
  for (const auto& [lr, st] : summary) {
    std::string frames;
    for (const auto& f : st.innermost) frames += "\n    " + f;
    log::error("rank {} stack ({}), innermost first:{}", globalRank(lr), stacksFile(lr),
               frames.empty() ? " <none>" : frames);
  }
}

std::vector<FailureDetail> HangResponder::finish(const HangStacks& stacks) {
  busy_ = false;
  for (const auto& a : stacks.remote) log::error("stacks on another node: {}", a);
  std::vector<Hang> ordered = hangs_;
  std::stable_partition(ordered.begin(), ordered.end(), [&](const Hang& h) {
    return std::find(outside_.begin(), outside_.end(), h.local_rank) != outside_.end();
  });
  std::vector<FailureDetail> out;
  for (const auto& h : ordered) {
    const WorkerState& w = workers_[static_cast<size_t>(h.local_rank)];
    FailureDetail d;
    std::string frames;
    auto it = stacks.summaries.find(h.local_rank);
    if (it != stacks.summaries.end())
      for (const auto& f : it->second.innermost) frames += f + "\n";
    d.error = ErrorFileContents{"hung: " + h.why, frames, fmt::format("{:.0f}", now_)};
    d.exit = WorkerExit{w.local_rank, w.pid, ExitStatus{false, kHangExitCode, true}, now_, false};
    d.global_rank = w.global_rank;
    d.host = host_;
    d.error_file = stacksFile(h.local_rank);
    out.push_back(std::move(d));
  }
  return out;
}

}  // namespace ddpl::launcher

namespace ddpl::launcher {

HangWatch::HangWatch(HangOptions options, std::string host)
    : options_(options), detector_(options), responder_(std::move(host)) {}

bool HangWatch::watching() const {
  bool on = !options_.timeout_sec || *options_.timeout_sec > 0;
  return on && !responder_.busy();
}

void HangWatch::startGroup(int nproc, double now) {
  detector_.start(nproc, now);
  output_seen_.assign(static_cast<size_t>(nproc), 0);
}

void HangWatch::onExit(int local_rank) { detector_.onExit(local_rank); }

std::vector<Hang> HangWatch::check(const std::vector<Sample>& live, double now) {
  bool want_cpu = options_.timeout_sec.has_value();
  for (const auto& r : live) {
    auto& seen = output_seen_[static_cast<size_t>(r.local_rank)];
    bool wrote = r.output_bytes != seen;
    seen = r.output_bytes;
    detector_.observe(r.local_rank, r.step, want_cpu ? processTreeCpuSeconds(r.pid) : 0, wrote,
                      now);
    if (r.finished_stepping) detector_.onFinished(r.local_rank, now);
  }
  return detector_.check(now);
}

void HangWatch::respond(const std::vector<Hang>& hangs, double now,
                        std::vector<WorkerState> workers, std::string attempt_dir, int group_rank,
                        const ProgressTracker& progress, web::MetricsEndpoint* metrics,
                        StacksService& stacks, Hooks hooks) {
  std::string why = responder_.begin(hangs, now, std::move(workers), std::move(attempt_dir),
                                     group_rank, progress, metrics);
  auto shared = std::make_shared<Hooks>(std::move(hooks));
  stacks.takeHangStacks(
      why,
      [this, shared](const HangStacks& h) {
        if (shared->ended()) return;
        responder_.onStacksSaved(h);
        shared->saved(h.text);
      },
      [this, shared](HangStacks h) {
        if (shared->ended()) return;
        shared->found(responder_.finish(h));
      });
}

}  // namespace ddpl::launcher
