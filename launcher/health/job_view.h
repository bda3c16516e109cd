#pragma once
// The live view of a node's ranks (issue 18): one status line kept at the bottom of a terminal
// console, or a plain log line every --monitor-log-interval when the console is not one. Pure:
// the agent feeds it samples with their times (steps from the heartbeats, CPU time and memory
// from /proc, GPU figures from NVML when present), so it is unit-tested without processes.
#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <vector>

namespace ddpl::launcher {

struct RankUsage {
  int local_rank = 0;
  int global_rank = 0;
  bool alive = true;
  uint64_t step = 0;       // from the heartbeat; 0: none yet (or the rank never beats)
  uint64_t waited_us = 0;  // the heartbeat's second field: time waited in collectives so far
  double cpu_seconds = 0;  // user + system so far
  int64_t rss_bytes = -1;  // resident memory; -1: unknown
  std::optional<double> gpu_util_percent;
  std::optional<int64_t> gpu_memory_bytes;
  std::optional<int64_t> checkpoint_bytes;  // in launch's checkpoint memory
};

struct JobFigures {
  int alive = 0, total = 0;
  double uptime_sec = 0;
  bool stepping = false;  // some rank reports steps
  uint64_t step = 0;      // the slowest rank's step: where the job as a whole is
  std::optional<double> steps_per_sec;
  // The rank with the most time of its own per step over the window (only with two or more
  // stepping ranks), and the median rank's for comparison. Its own time: the step time less the
  // time it waited in collectives, where it reports that; in lockstep every rank's step time is
  // the slowest one's, so only this tells the slow rank from those that wait for it (as the
  // straggler warning does).
  std::optional<int> slowest_global_rank;
  double slowest_ms = 0, median_ms = 0;
  std::vector<std::optional<double>> cpu_percent;  // per local rank, over the window
  std::vector<int64_t> rss_bytes;                  // per local rank, -1 unknown
  std::vector<std::optional<double>> gpu_util_percent;
  std::vector<std::optional<int64_t>> gpu_memory_bytes;
  std::vector<std::optional<int64_t>> checkpoint_bytes;
};

class JobView {
 public:
  // Rates are taken over the samples of the last `window_sec`.
  explicit JobView(double window_sec = 10) : window_sec_(window_sec) {}
  void start(double now);  // a new attempt: forgets the samples of the last one
  void sample(std::vector<RankUsage> ranks, double now);
  JobFigures figures() const;

  // One line of at most `columns` display columns (UTF-8 aware), no newline.
  std::string statusLine(size_t columns) const;
  // The same figures for a log file: no width limit, every rank listed.
  std::string logLine() const;

 private:
  struct Sample {
    double time;
    std::vector<RankUsage> ranks;
  };
  double window_sec_;
  double started_ = 0;
  std::deque<Sample> samples_;
};

// Cuts `text` to at most `columns` display columns: UTF-8 sequences count as one column each,
// never split; ANSI escape sequences count as none and a cut line ends with a reset.
std::string fitColumns(const std::string& text, size_t columns);

}  // namespace ddpl::launcher
