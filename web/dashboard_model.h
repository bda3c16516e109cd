#pragma once
// What the job's web page (launch --dashboard, docs/monitoring.md) shows, as the JSON of
// GET /api/job: a row per rank, the job's figures over time, the restarts and membership
// changes on that time axis, the incident table, the end-of-run summary and the last stacks.
// Pure: the agent feeds it and takes the text; the HTTP server only hands the text out, so a
// page polling it costs the agent nothing. Everything it keeps is bounded (samples, events,
// text sizes) whatever the job does, and every text is masked as a manifest is
// (common/secrets.h): a page readable from loopback shows no command-line or environment secret.
#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace ddpl::web {

struct DashboardRank {
  std::string node;  // host name
  int node_rank = 0;
  int global_rank = 0;
  int local_rank = 0;
  int pid = 0;
  // starting | training | straggling | hung | exited | restarting
  std::string state = "starting";
  std::optional<int> exit_code;  // when exited
  uint64_t step = 0;
  std::optional<double> steps_per_sec, step_ms, wait_ms, cpu_percent, gpu_util_percent;
  std::optional<int64_t> rss_bytes, gpu_memory_bytes, checkpoint_bytes;
  std::string last_line;
};

struct DashboardJob {
  std::string run_id;
  std::string state = "starting";  // starting | training | restarting | finished | failed
  int attempt = 0;
  int restarts_used = 0;
  int max_restarts = 0;
  int world_size = 0;
  int nodes = 1;
  uint64_t step = 0;
  std::optional<double> steps_per_sec;
  double uptime_s = 0;
};

class DashboardModel {
 public:
  static constexpr size_t kMaxSamples = 900;      // 15 min of points
  static constexpr double kSeriesInterval = 1.0;  // seconds between two points at least
  static constexpr size_t kMaxEvents = 256;
  static constexpr size_t kMaxLineBytes = 512;         // a rank's last line as shown
  static constexpr size_t kMaxTextBytes = 256 * 1024;  // the summary, the incidents, the stacks
  // Rows of the incident table the agent hands (its oldest past this are a line saying so).
  static constexpr size_t kMaxIncidentRows = 100;

  // One reading of every rank at unix time `now`: the rows, and a point of each series when
  // the last is kSeriesInterval old.
  void sample(const DashboardJob& job, std::vector<DashboardRank> ranks, double now);
  // The job's figures between samples (its state when it ends).
  void setJob(const DashboardJob& job) { job_ = job; }
  // A mark on the time axis: kind restart | membership | hang | straggler | exit.
  void event(double t, const std::string& kind, const std::string& text);
  void setSummary(const std::string& text);
  // The incident table: where each lost second went (launcher/warm/restart_phases.h).
  void setIncidents(const std::string& text);
  void setStacks(double t, const std::string& reason, const std::string& text);

  std::string json(double now) const;
  const std::vector<DashboardRank>& ranks() const { return ranks_; }

 private:
  DashboardJob job_;
  std::vector<DashboardRank> ranks_;
  std::deque<double> t_;
  std::deque<std::optional<double>> steps_per_sec_;
  // By global rank; every deque as long as t_ (padded with nulls for a rank not then there).
  std::map<int, std::deque<std::optional<double>>> step_ms_, gpu_util_;
  struct Event {
    double t;
    std::string kind, text;
  };
  std::deque<Event> events_;
  std::optional<std::string> summary_;
  std::optional<std::string> incidents_;
  struct Stacks {
    double t;
    std::string reason, text;
  };
  std::optional<Stacks> stacks_;
};

// A node's rows for the other nodes' pages (through the job's store), and back. What comes back
// is another machine's: at most kMaxPeerRanks rows, every number range-checked, every text cut;
// anything malformed is none.
inline constexpr size_t kMaxPeerRanks = 1024;
std::string encodeRanks(const std::vector<DashboardRank>& ranks);
std::vector<DashboardRank> decodeRanks(const std::string& text);

// Cuts `text` to at most `bytes` on a UTF-8 boundary, with "…" when cut.
std::string cutUtf8(const std::string& text, size_t bytes);

}  // namespace ddpl::web
