#pragma once
// The agent's glue between its ranks and what shows them: the live view (a status line kept at
// the bottom of a terminal, or a log line every --monitor-log-interval), this node's status
// for the job (HealthBus::publishStatus), the metrics endpoint (--metrics-port) and the
// GPU figures from NVML, loaded at the first update (off the start-up path).
//
// The live view, the dashboard and the metrics are three reporting parts (reporting_part.h):
// every public call below contains what each does, so that none of them, whatever a worker
// prints or a peer publishes, ends the job or changes its exit code.
//
// Threads: the agent's loop thread only.
#include <atomic>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "launcher/agent/output.h"
#include "launcher/agent/reporting_part.h"
#include "launcher/agent/worker_state.h"
#include "launcher/cli/options.h"
#include "launcher/gpu/nvml.h"
#include "launcher/health/job_view.h"
#include "launcher/health/progress.h"
#include "launcher/membership/health_bus.h"
#include "launcher/membership/node_values.h"
#include "web/dashboard.h"
#include "web/dashboard_model.h"
#include "web/metrics.h"

namespace ddpl::launcher {

// One rank as a monitor tick reads it: the worker and its heartbeat.
struct RankReading {
  WorkerState worker;
  uint64_t step = 0;
  uint64_t waited_us = 0;
  std::optional<int64_t> checkpoint_bytes;  // in launch's checkpoint memory
};

class LiveView {
 public:
  // `status_line`: keep the view at the bottom of the console (the router draws it there).
  // `bus`: where this node's status goes; `values`: where its rows go for the other nodes'
  // dashboards, and theirs come from.
  LiveView(const LaunchOptions& options, std::string host, bool status_line, OutputRouter& router,
           HealthBus& bus, NodeValues& values);
  ~LiveView();  // stops the thread that reads the other nodes' rows

  // --metrics-port: starts the endpoint (throws as startMetricsEndpoint does). Null without.
  void startMetrics();
  // For the hang responder's counts; the agent's own calls go through countRestart().
  web::MetricsEndpoint* metrics() const { return metrics_.get(); }

  // --dashboard: starts the page's server (throws as startDashboard does) with a new token in
  // RUN_DIR/dashboard-token (private to the user). Nothing without the flag.
  void startDashboard(const std::string& run_dir, const std::string& run_id);
  bool hasDashboard() const { return dashboard_ != nullptr; }
  // What only the agent knows, for the page: a mark on its time axis (restart, membership,
  // hang, straggler, exit), the job's state, a rank's end, a hung rank, the end-of-run
  // summary, stacks taken. Each a no-op without --dashboard.
  void dashboardEvent(const std::string& kind, const std::string& text, double now);
  void setJobState(const std::string& state, double now);
  void markExited(int local_rank, int exit_code);
  void markHung(int local_rank);
  void setSummary(const std::string& text, double now);
  void addToSummary(const std::string& text, double now);
  // The incident table (run_summary.h's incidentText), replaced whenever a row changes.
  void setIncidents(const std::string& text, double now);
  void setStacks(const std::string& reason, const std::string& text, double now);
  // The run is over: an open page gets the last state (the summary) before launch exits,
  // within a second at most.
  void finishDashboard();
  // The page asked for every rank's stack since the last call.
  bool stacksAsked();
  // --metrics-port: the group on this node restarted.
  void countRestart();

  // A new attempt (of `round`): forgets the last one's samples; marks a change of the job's
  // membership on the dashboard's time axis.
  void startAttempt(int attempt, int64_t round, int world_size, double now, int nodes = 1,
                    int node_rank = 0, int restarts_used = 0);
  // Samples every rank and shows it when due: twice a second at most, whatever
  // --monitor-interval is (reading /proc for every rank is not free on a 64-rank node).
  void maybeUpdate(const std::vector<RankReading>& ranks, ProgressTracker& progress, double now);
  // Logs (and counts) the ranks that became stragglers; once a second at most.
  void reportStragglers(ProgressTracker& progress, double now);

  // The node's status in one line, as the log and `launch status` show it.
  std::string logLine();

 private:
  void update(const std::vector<RankReading>& ranks, ProgressTracker& progress, double now);
  std::vector<RankUsage> readUsage(const std::vector<RankReading>& ranks);
  void updateDashboard(const std::vector<RankReading>& ranks, const std::vector<RankUsage>& usage,
                       const JobFigures& figures, const ProgressTracker& progress, double now);
  void publishDashboard(double now);
  void addGpuFigures(std::vector<RankUsage>& usage, const std::vector<RankReading>& ranks);
  std::vector<web::RankMetrics> rankMetrics(const std::vector<RankUsage>& usage,
                                            const ProgressTracker& progress) const;

  // One per part, each failure logged once (reporting_part.h). First: the dashboard's server
  // threads use its part until dashboard_ is gone.
  ReportingPart view_part_{"the live view"};
  ReportingPart dashboard_part_{"the dashboard"};
  ReportingPart metrics_part_{"the metrics endpoint"};
  const LaunchOptions& options_;
  std::string host_;
  bool status_line_, view_log_;
  OutputRouter& router_;
  HealthBus& bus_;
  NodeValues& values_;
  JobView view_;
  std::unique_ptr<web::MetricsEndpoint> metrics_;
  std::unique_ptr<Nvml> nvml_;  // null when the machine has no driver
  bool nvml_tried_ = false;
  double next_view_ = 0, next_view_log_ = 0, next_straggler_check_ = 0;
  // --dashboard: the server, what it shows, and what the agent told it of this attempt.
  std::unique_ptr<web::DashboardEndpoint> dashboard_;
  web::DashboardModel model_;
  web::DashboardJob job_;
  std::map<int, int> exited_;  // local rank -> exit code
  std::string summary_;
  std::map<int, bool> hung_;
  std::atomic<int> rank_offset_{0};  // read on the server's threads (logs by global rank)
  std::atomic<int> node_rank_{0}, nodes_{1};
  // Several nodes: this node's rows go to the job's store every kPeerInterval, and a thread of
  // its own reads the other nodes' (each read bounded; never on the loop).
  static constexpr double kPeerInterval = 2;
  double next_peer_publish_ = 0;
  std::thread peers_thread_;
  std::mutex peers_mu_;
  std::condition_variable peers_cv_;
  bool peers_stop_ = false;                               // guarded by peers_mu_
  std::map<int, std::vector<web::DashboardRank>> peers_;  // by node rank; guarded by peers_mu_
  void readPeers();
};

}  // namespace ddpl::launcher
