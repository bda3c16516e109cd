#pragma once
// What each worker of an attempt did, for the end-of-run summary: steps from its heartbeat
// (common/heartbeat.h), CPU time and peak memory from its exit (wait4's rusage). Pure: the agent
// feeds it observations with their times, so it is unit-tested without processes.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace ddpl::launcher {

struct RankProgress {
  int local_rank = 0;
  int global_rank = 0;
  double started = 0;                  // seconds (any clock, the same for every call)
  std::optional<double> ended;         // when it exited
  uint64_t step = 0;                   // last step it reported
  std::optional<double> first_beat;    // when a step was first seen
  double last_change = 0;              // when the step last changed
  uint64_t first_step = 0;             // the step first seen
  double cpu_seconds = 0;              // user + system, at exit
  int64_t peak_rss_kb = 0;             // at exit
  // Recent step changes (time, step, microseconds waited in collectives so far), newest last.
  struct Sample {
    double time;
    uint64_t step;
    uint64_t waited_us;
  };
  std::vector<Sample> recent;
  // GPU figures while it ran (NVML), where known.
  double gpu_util_sum = 0;
  int gpu_util_samples = 0;
  int64_t peak_gpu_bytes = -1;
  bool straggler = false;  // reported as one in this attempt
  std::string straggler_why;
  std::optional<double> meanStepSeconds() const;
};

// A rank persistently slower than the others: its own time per step (step time less the time it
// waited inside collectives, when the rank reports that) above the median rank's by `ratio`.
struct Straggler {
  int local_rank = 0;
  int global_rank = 0;
  double own_ms = 0;     // per step, over the window
  double median_ms = 0;  // the median rank's
  int steps = 0;         // the window
  std::string describe() const;
};

// When a rank counts as hung (issue 18). Pure: fed observations with their times.
struct HangOptions {
  // Set (--hang-timeout): no progress for this long is a hang, for every rank; progress is a
  // new step for a rank that reports steps, CPU time or output for one that never has.
  // Unset: only ranks that report steps are watched, with an automatic limit.
  std::optional<double> timeout_sec;
  // A rank with no step yet, while another rank of the node has reported one: hung after this
  // long from its start (model loading takes time).
  double first_step_timeout_sec = 1800;
  // The automatic limit: this many times the slowest step seen, never below the floor.
  double auto_multiple = 10;
  double auto_floor_sec = 600;
};

struct Hang {
  int local_rank = 0;
  double idle_sec = 0;   // how long without progress
  double limit_sec = 0;  // the limit it passed
  std::string why;       // "no step for 12.0s (limit 10.0s) after step 7"
};

class HangDetector {
 public:
  explicit HangDetector(HangOptions options) : options_(options) {}
  void start(int nproc, double now);
  // Observations: the rank's step (0: none yet), CPU seconds so far, and whether it wrote
  // output since the last call.
  void observe(int local_rank, uint64_t step, double cpu_seconds, bool wrote_output, double now);
  void onExit(int local_rank);
  // Ranks past their limit now, each reported once per start().
  std::vector<Hang> check(double now);
  // The limit a stepping rank has now (for the log); 0 when it is not watched.
  double limitFor(int local_rank) const;

 private:
  struct Rank {
    double started = 0;
    double last_progress = 0;
    uint64_t step = 0;
    double cpu = -1;
    double slowest_step = 0;
    bool alive = true;
    bool reported = false;
  };
  HangOptions options_;
  std::vector<Rank> ranks_;
};

class ProgressTracker {
 public:
  void start(int nproc, int rank_offset, double now);
  void onStep(int local_rank, uint64_t step, double now, uint64_t waited_us = 0);
  // Ranks that have become stragglers since the last call (each reported once per attempt),
  // judged over their last `window` steps once every rank has that many.
  std::vector<Straggler> newStragglers(double ratio = 1.2, size_t window = 20,
                                       double min_gap_ms = 2);
  void onExit(int local_rank, double now, double cpu_seconds, int64_t peak_rss_kb);
  // One GPU sample of a rank: its device's utilisation and the memory its process holds.
  void onGpu(int local_rank, std::optional<double> util_percent, std::optional<int64_t> bytes);
  const std::vector<RankProgress>& ranks() const { return ranks_; }

  // A header and one row per rank (global and local rank, wall, steps, mean step, CPU time,
  // mean CPU%, peak memory, and mean GPU% and peak GPU memory when any rank had a GPU; one word
  // each, "-" when unknown), then advice
  // where the figures point to a cause. `cores`: CPUs this node may use; `threads_per_rank`:
  // OMP_NUM_THREADS as the workers got it (0: unknown).
  std::string summary(double now, int cores, int threads_per_rank) const;

 private:
  std::vector<RankProgress> ranks_;
};

}  // namespace ddpl::launcher
