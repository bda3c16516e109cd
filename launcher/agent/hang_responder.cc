#include "launcher/agent/hang_responder.h"

#include <algorithm>
#include <map>
#include <memory>

#include "common/log.h"
#include "launcher/agent/containment.h"
#include "launcher/health/hang_report.h"

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
  std::vector<RankEvidence> ranks;
  for (const auto& [lr, st] : summary) {
    auto fr = stacks.recorders.find(lr);
    ranks.push_back(
        {globalRank(lr), lr, st,
         fr == stacks.recorders.end() ? std::nullopt : std::optional<FlightRecord>(fr->second)});
  }
  HangReport report = analyzeHang(ranks);
  for (const auto& g : report.groups) log::error("hang report: {}", g);
  std::map<std::string, std::string> unanswered;  // ranks by what their recorder said
  for (const auto& [lr, fr] : stacks.recorders)
    if (!fr.error.empty()) {
      std::string& names = unanswered[fr.error];
      names += (names.empty() ? "" : ", ") + std::to_string(globalRank(lr));
    }
  for (const auto& [error, names] : unanswered)
    log::info("flight recorder of rank(s) {}: {}", names, error);
  for (const auto& r : ranks)
    if (std::find(report.culprits.begin(), report.culprits.end(), r.global_rank) !=
        report.culprits.end())
      outside_.push_back(r.local_rank);
  if (!report.culprits.empty()) {
    std::string names;
    for (int g : report.culprits) names += (names.empty() ? "" : ", ") + std::to_string(g);
    log::error("likely culprit: rank(s) {} ({})", names, report.why);
  } else if (!report.note.empty()) {
    log::error("no likely culprit among these ranks: {}", report.note);
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
  return options_.on() && !responder_.busy();
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
