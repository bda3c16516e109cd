#include "launcher/agent/live_view.h"

#include <algorithm>
#include <map>

#include "common/log.h"
#include "launcher/agent/containment.h"
#include "launcher/health/metrics_plugin.h"

namespace ddpl::launcher {

LiveView::LiveView(const LaunchOptions& options, std::string host, bool status_line,
                   OutputRouter& router, RendezvousHandler& rdzv)
    : options_(options),
      host_(std::move(host)),
      status_line_(status_line),
      view_log_(options.monitor == MonitorMode::kLog ||
                (options.monitor == MonitorMode::kAuto && !status_line)),
      router_(router),
      rdzv_(rdzv) {}

void LiveView::startMetrics() {
  if (!options_.metrics_port) return;
  MetricsOptions mo;
  mo.host = options_.metrics_host;
  mo.port = *options_.metrics_port;
  mo.node = host_;
  metrics_ = startMetricsEndpoint(mo);
  const bool v6 = mo.host.find(':') != std::string::npos;
  log::info("metrics of this node's ranks on http://{}{}{}:{}/metrics", v6 ? "[" : "", mo.host,
            v6 ? "]" : "", metrics_->port());
}

void LiveView::startAttempt(int attempt, int world_size, double now) {
  view_.start(now);
  if (metrics_) metrics_->setJob({attempt, world_size, options_.max_restarts});
}

void LiveView::maybeUpdate(const std::vector<RankReading>& ranks, ProgressTracker& progress,
                           double now) {
  if (now >= next_view_) update(ranks, progress, now);
}

void LiveView::reportStragglers(ProgressTracker& progress, double now) {
  if (now < next_straggler_check_) return;
  next_straggler_check_ = now + 1;
  for (const auto& s : progress.newStragglers()) {
    log::warn("straggler on {}: {}", host_, s.describe());
    if (metrics_) metrics_->onStraggler(s.global_rank, s.local_rank);
  }
}

void LiveView::update(const std::vector<RankReading>& ranks, ProgressTracker& progress,
                      double now) {
  next_view_ = now + std::max(0.5, options_.monitor_interval_sec);
  std::vector<RankUsage> usage;
  usage.reserve(ranks.size());
  for (const auto& r : ranks) {
    RankUsage u;
    u.local_rank = r.worker.local_rank;
    u.global_rank = r.worker.global_rank;
    u.alive = r.worker.alive;
    u.step = r.step;
    u.waited_us = r.waited_us;
    u.checkpoint_bytes = r.checkpoint_bytes;
    if (r.worker.alive) {
      u.cpu_seconds = processCpuSeconds(r.worker.pid);
      u.rss_bytes = processRssBytes(r.worker.pid);
    }
    usage.push_back(std::move(u));
  }
  addGpuFigures(usage, ranks);
  for (const auto& u : usage)
    if (u.gpu_util_percent || u.gpu_memory_bytes)
      progress.onGpu(u.local_rank, u.gpu_util_percent, u.gpu_memory_bytes);
  std::vector<RankMetrics> rank_metrics;
  if (metrics_) rank_metrics = rankMetrics(usage, progress);
  view_.sample(std::move(usage), now);
  if (metrics_) {
    JobFigures f = view_.figures();
    for (size_t i = 0; i < rank_metrics.size() && i < f.cpu_percent.size(); ++i)
      rank_metrics[i].cpu_percent = f.cpu_percent[i];
    metrics_->update(rank_metrics);
  }
  const std::string line = view_.logLine();  // the node's status, for the job and the log
  rdzv_.publishStatus(line);
  if (status_line_) router_.setStatus(view_.statusLine(SIZE_MAX));
  if (view_log_ && now >= next_view_log_) {
    if (next_view_log_ > 0) log::info("ranks: {}", line);
    next_view_log_ = now + options_.monitor_log_interval_sec;
  }
}

// Each rank's GPU: the devices where NVML sees its process hold memory (utilisation is per
// device: the one where it holds the most). A rank NVML does not list (no GPU, another pid
// namespace) has none.
void LiveView::addGpuFigures(std::vector<RankUsage>& usage, const std::vector<RankReading>& ranks) {
  if (!nvml_tried_) {
    nvml_tried_ = true;
    std::string why;
    nvml_ = Nvml::load(kDefaultNvmlLibrary, &why);
    if (!nvml_) log::debug("no GPU figures: {}", why);
  }
  if (!nvml_) return;
  try {
    std::map<pid_t, std::pair<int64_t, int>> held;  // pid -> (bytes in all, busiest device)
    std::map<pid_t, int64_t> most;
    std::vector<std::optional<unsigned>> util(static_cast<size_t>(nvml_->deviceCount()));
    for (int d = 0; d < nvml_->deviceCount(); ++d) {
      util[static_cast<size_t>(d)] = nvml_->sample(d).utilization_percent;
      auto procs = nvml_->processMemory(d);
      if (!procs) continue;
      for (const auto& [pid, bytes] : *procs) {
        auto& h = held[pid];
        h.first += static_cast<int64_t>(bytes);
        if (static_cast<int64_t>(bytes) > most[pid]) {
          most[pid] = static_cast<int64_t>(bytes);
          h.second = d;
        }
      }
    }
    for (auto& u : usage) {
      const WorkerState& w = ranks[static_cast<size_t>(u.local_rank)].worker;
      auto it = held.find(w.pid);
      if (!w.alive || it == held.end()) continue;
      u.gpu_memory_bytes = it->second.first;
      if (auto pct = util[static_cast<size_t>(it->second.second)]) u.gpu_util_percent = *pct;
    }
  } catch (const std::exception& e) {
    log::warn("GPU figures stop: {}", e.what());  // a GPU fell off the bus: say it once
    nvml_.reset();
  }
}

std::vector<RankMetrics> LiveView::rankMetrics(const std::vector<RankUsage>& usage,
                                               const ProgressTracker& progress) const {
  std::vector<RankMetrics> out;
  for (const auto& u : usage) {
    RankMetrics m;
    m.rank = u.global_rank;
    m.local_rank = u.local_rank;
    m.alive = u.alive;
    m.step = u.step;
    if (static_cast<size_t>(u.local_rank) < progress.ranks().size())
      m.step_seconds = progress.ranks()[static_cast<size_t>(u.local_rank)].meanStepSeconds();
    if (u.rss_bytes >= 0) m.rss_bytes = u.rss_bytes;
    m.gpu_util_percent = u.gpu_util_percent;
    m.gpu_memory_bytes = u.gpu_memory_bytes;
    out.push_back(m);
  }
  return out;
}

}  // namespace ddpl::launcher
