#include "launcher/agent/live_view.h"

#include <fcntl.h>
#include <sys/random.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>

#include "common/errors.h"
#include "common/file_io.h"
#include "common/log.h"
#include "common/secrets.h"
#include "launcher/agent/containment.h"
#include "web/plugin.h"

namespace ddpl::launcher {

LiveView::LiveView(const LaunchOptions& options, std::string host, bool status_line,
                   OutputRouter& router, HealthBus& bus, NodeValues& values)
    : options_(options),
      host_(std::move(host)),
      status_line_(status_line),
      view_log_(options.monitor == MonitorMode::kLog ||
                (options.monitor == MonitorMode::kAuto && !status_line)),
      router_(router),
      bus_(bus),
      values_(values) {}

LiveView::~LiveView() {
  {
    std::lock_guard<std::mutex> lock(peers_mu_);
    peers_stop_ = true;
  }
  peers_cv_.notify_all();
  if (peers_thread_.joinable()) peers_thread_.join();
}

void LiveView::readPeers() {
  std::unique_lock<std::mutex> lock(peers_mu_);
  while (!peers_cv_.wait_for(lock, std::chrono::duration<double>(kPeerInterval),
                             [this] { return peers_stop_; })) {
    const int nodes = nodes_.load(), me = node_rank_.load();
    lock.unlock();
    std::map<int, std::vector<web::DashboardRank>> got;
    for (int n = 0; n < nodes && n < static_cast<int>(web::kMaxPeerRanks); ++n) {
      if (n == me) continue;
      try {
        if (auto v = values_.nodeValue("dashboard", n)) {
          auto rows = web::decodeRanks(*v);
          // Another node's word for its own rows only.
          rows.erase(std::remove_if(rows.begin(), rows.end(),
                                    [n](const web::DashboardRank& r) { return r.node_rank != n; }),
                     rows.end());
          got[n] = std::move(rows);
        }
      } catch (const std::exception& e) {
        log::debug("dashboard: no rows from node {}: {}", n, e.what());
      }
    }
    lock.lock();
    peers_ = std::move(got);
  }
}

void LiveView::startMetrics() {
  if (!options_.metrics_port) return;
  web::MetricsOptions mo;
  mo.host = options_.metrics_host;
  mo.port = *options_.metrics_port;
  mo.node = host_;
  metrics_ = web::startMetricsEndpoint(mo);
  const bool v6 = mo.host.find(':') != std::string::npos;
  log::info("metrics of this node's ranks on http://{}{}{}:{}/metrics", v6 ? "[" : "", mo.host,
            v6 ? "]" : "", metrics_->port());
}

void LiveView::startAttempt(int attempt, int64_t round, int world_size, double now, int nodes,
                            int node_rank, int restarts_used) {
  if (dashboard_ && attempt > 0 && (world_size != job_.world_size || nodes != job_.nodes))
    dashboardEvent("membership",
                   fmt::format("round {}: {} node(s), world size {} (was {} and {})", round, nodes,
                               world_size, job_.nodes, job_.world_size),
                   now);
  view_.start(now);
  if (metrics_)
    metrics_part_.contain([&] { metrics_->setJob({attempt, world_size, options_.max_restarts}); });
  job_.attempt = attempt;
  job_.world_size = world_size;
  job_.nodes = nodes;
  job_.restarts_used = restarts_used;
  job_.max_restarts = options_.max_restarts;
  job_.state = "starting";
  node_rank_ = node_rank;
  nodes_ = nodes;
  next_peer_publish_ = 0;
  {
    std::lock_guard<std::mutex> lock(peers_mu_);
    peers_.clear();  // the last round's
  }
  exited_.clear();
  hung_.clear();
}

void LiveView::startDashboard(const std::string& run_dir, const std::string& run_id) {
  if (!options_.dashboard_port) return;
  unsigned char raw[16];
  if (getrandom(raw, sizeof raw, 0) != static_cast<ssize_t>(sizeof raw))
    throw Error(std::string("cannot make the dashboard's token: getrandom: ") + strerror(errno));
  std::string token;
  for (unsigned char c : raw) token += fmt::format("{:02x}", c);
  // Created here only, private, never through a link someone planted.
  const std::string path = run_dir + "/dashboard-token";
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) throw Error("cannot create " + path + ": " + strerror(errno));
  std::string line = token + "\n";
  int rc = writeAll(fd, line.data(), line.size());
  ::close(fd);
  if (rc != 0) throw Error("cannot write " + path + ": " + strerror(rc));
  web::DashboardOptions o;
  o.host = options_.dashboard_host;
  o.port = *options_.dashboard_port;
  o.token = token;
  router_.keepRecentLines(true);
  // On the server's threads: what throws there is this part's too.
  dashboard_ = web::startDashboard(o, [this](int global_rank) {
    return dashboard_part_.contain(
        [&] {
          std::vector<std::string> lines = router_.recentLines(global_rank - rank_offset_.load());
          for (auto& l : lines) l = maskSecretsInText(l);
          return lines;
        },
        std::vector<std::string>{});
  });
  job_.run_id = run_id;
  peers_thread_ = std::thread([this] { readPeers(); });
  log::info(
      "dashboard of the job on http://{}:{}/ (readable by this user, uid {}; other users, "
      "other machines and actions need the token in {})",
      o.host, dashboard_->port(), geteuid(), path);
  dashboard_part_.contain([&] { publishDashboard(0); });
}

void LiveView::dashboardEvent(const std::string& kind, const std::string& text, double now) {
  if (!dashboard_) return;
  dashboard_part_.contain([&] { model_.event(now, kind, text); });
}

void LiveView::setJobState(const std::string& state, double now) {
  if (!dashboard_) return;
  job_.state = state;
  dashboard_part_.contain([&] {
    model_.setJob(job_);
    publishDashboard(now);
  });
}

void LiveView::markExited(int local_rank, int exit_code) { exited_[local_rank] = exit_code; }
void LiveView::markHung(int local_rank) { hung_[local_rank] = true; }

void LiveView::setSummary(const std::string& text, double now) {
  if (!dashboard_) return;
  summary_ = text;
  dashboard_part_.contain([&] {
    model_.setSummary(text);
    publishDashboard(now);
  });
}

void LiveView::addToSummary(const std::string& text, double now) {
  if (!dashboard_) return;
  summary_ += text;
  dashboard_part_.contain([&] {
    model_.setSummary(summary_);
    publishDashboard(now);
  });
}

void LiveView::setIncidents(const std::string& text, double now) {
  if (!dashboard_ || text.empty()) return;
  dashboard_part_.contain([&] {
    model_.setIncidents(text);
    publishDashboard(now);
  });
}

void LiveView::setStacks(const std::string& reason, const std::string& text, double now) {
  if (!dashboard_) return;
  dashboard_part_.contain([&] {
    model_.setStacks(now, reason, text);
    publishDashboard(now);
  });
}

void LiveView::finishDashboard() {
  if (dashboard_) dashboard_part_.contain([&] { dashboard_->waitForOpenPages(1.5); });
}

bool LiveView::stacksAsked() {
  return dashboard_ &&
         dashboard_part_.contain([&] { return dashboard_->takeStacksRequest(); }, false);
}

std::string LiveView::logLine() {
  return view_part_.contain([&] { return view_.logLine(); }, std::string("unknown"));
}

void LiveView::countRestart() {
  if (metrics_) metrics_part_.contain([&] { metrics_->onRestart(); });
}

void LiveView::publishDashboard(double now) {
  if (!dashboard_) return;
  if (now <= 0)
    now = static_cast<double>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                  std::chrono::system_clock::now().time_since_epoch())
                                  .count()) /
          1000.0;
  dashboard_->publish(model_.json(now));
}

void LiveView::updateDashboard(const std::vector<RankReading>& ranks,
                               const std::vector<RankUsage>& usage, const JobFigures& f,
                               const ProgressTracker& progress, double now) {
  std::vector<web::DashboardRank> rows;
  for (size_t i = 0; i < usage.size(); ++i) {
    const RankUsage& u = usage[i];
    rank_offset_ = u.global_rank - u.local_rank;
    web::DashboardRank r;
    r.node = host_;
    r.node_rank = node_rank_;
    r.global_rank = u.global_rank;
    r.local_rank = u.local_rank;
    for (const auto& reading : ranks)
      if (reading.worker.local_rank == u.local_rank) r.pid = reading.worker.pid;
    r.step = u.step;
    const RankProgress* p = static_cast<size_t>(u.local_rank) < progress.ranks().size()
                                ? &progress.ranks()[static_cast<size_t>(u.local_rank)]
                                : nullptr;
    if (p) {
      if (auto s = p->meanStepSeconds(); s && *s > 0) {
        r.step_ms = *s * 1000;
        r.steps_per_sec = 1 / *s;
      }
      // Time waited in collectives per step, over the readings kept.
      if (p->recent.size() >= 2) {
        const auto& a = p->recent.front();
        const auto& b = p->recent.back();
        if (b.step > a.step && b.waited_us >= a.waited_us && b.waited_us > 0)
          r.wait_ms = static_cast<double>(b.waited_us - a.waited_us) / 1000.0 /
                      static_cast<double>(b.step - a.step);
      }
    }
    if (i < f.cpu_percent.size()) r.cpu_percent = f.cpu_percent[i];
    if (u.rss_bytes >= 0) r.rss_bytes = u.rss_bytes;
    r.gpu_util_percent = u.gpu_util_percent;
    r.gpu_memory_bytes = u.gpu_memory_bytes;
    r.checkpoint_bytes = u.checkpoint_bytes;
    r.last_line = router_.lastLine(u.local_rank);
    if (auto e = exited_.find(u.local_rank); !u.alive && e != exited_.end()) {
      r.state = "exited";
      r.exit_code = e->second;
    } else if (!u.alive) {
      r.state = job_.state == "restarting" ? "restarting" : "exited";
    } else if (hung_.count(u.local_rank)) {
      r.state = "hung";
    } else if (p && p->straggler) {
      r.state = "straggling";
    } else if (u.step > 0) {
      r.state = "training";
    } else {
      r.state = "starting";
    }
    rows.push_back(std::move(r));
  }
  if (nodes_.load() > 1) {
    // Several nodes with --dashboard: each one's rows go to the job's store for the others'
    // pages (only theirs: a job without the flag writes nothing there, an etcd one included).
    if (now >= next_peer_publish_) {
      next_peer_publish_ = now + kPeerInterval;
      values_.publishNodeValue("dashboard", web::encodeRanks(rows));
    }
    std::lock_guard<std::mutex> lock(peers_mu_);
    for (const auto& [n, theirs] : peers_)
      if (n < nodes_.load()) rows.insert(rows.end(), theirs.begin(), theirs.end());
    std::sort(rows.begin(), rows.end(),
              [](const web::DashboardRank& a, const web::DashboardRank& b) {
                return a.global_rank < b.global_rank;
              });
  }
  if (job_.state == "starting" && f.stepping) job_.state = "training";
  job_.step = f.step;
  job_.steps_per_sec = f.steps_per_sec;
  job_.uptime_s = f.uptime_sec;
  model_.sample(job_, std::move(rows), now);
  publishDashboard(now);
}

void LiveView::maybeUpdate(const std::vector<RankReading>& ranks, ProgressTracker& progress,
                           double now) {
  if (now >= next_view_) update(ranks, progress, now);
}

void LiveView::reportStragglers(ProgressTracker& progress, double now) {
  if (now < next_straggler_check_) return;
  next_straggler_check_ = now + 1;
  std::vector<Straggler> found;
  view_part_.contain([&] { found = progress.newStragglers(); });
  for (const auto& s : found) {
    log::warn("straggler on {}: {}", host_, s.describe());
    dashboardEvent("straggler", fmt::format("straggler on {}: {}", host_, s.describe()), now);
    if (metrics_)
      metrics_part_.contain([&] { metrics_->onStraggler(s.global_rank, s.local_rank); });
  }
}

// Each part on its own: one that throws costs the others nothing.
void LiveView::update(const std::vector<RankReading>& ranks, ProgressTracker& progress,
                      double now) {
  next_view_ = now + std::max(0.5, options_.monitor_interval_sec);
  std::vector<RankUsage> usage;
  JobFigures figures;
  view_part_.contain([&] {
    usage = readUsage(ranks);
    for (const auto& u : usage)
      if (u.gpu_util_percent || u.gpu_memory_bytes)
        progress.onGpu(u.local_rank, u.gpu_util_percent, u.gpu_memory_bytes);
    view_.sample(usage, now);
    figures = view_.figures();
  });
  if (dashboard_)
    dashboard_part_.contain([&] { updateDashboard(ranks, usage, figures, progress, now); });
  if (metrics_)
    metrics_part_.contain([&] {
      std::vector<web::RankMetrics> rank_metrics = rankMetrics(usage, progress);
      for (size_t i = 0; i < rank_metrics.size() && i < figures.cpu_percent.size(); ++i)
        rank_metrics[i].cpu_percent = figures.cpu_percent[i];
      metrics_->update(rank_metrics);
    });
  view_part_.contain([&] {
    const std::string line = view_.logLine();  // the node's status, for the log and the job
    if (status_line_) router_.setStatus(view_.statusLine(SIZE_MAX));
    if (view_log_ && now >= next_view_log_) {
      if (next_view_log_ > 0) log::info("ranks: {}", line);
      next_view_log_ = now + options_.monitor_log_interval_sec;
    }
    bus_.publishStatus(line);
  });
}

// CPU time and memory from /proc, GPU figures from NVML.
std::vector<RankUsage> LiveView::readUsage(const std::vector<RankReading>& ranks) {
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
  return usage;
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

std::vector<web::RankMetrics> LiveView::rankMetrics(const std::vector<RankUsage>& usage,
                                                    const ProgressTracker& progress) const {
  std::vector<web::RankMetrics> out;
  for (const auto& u : usage) {
    web::RankMetrics m;
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
