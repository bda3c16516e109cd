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
  std::optional<double> meanStepSeconds() const;
};

class ProgressTracker {
 public:
  void start(int nproc, int rank_offset, double now);
  void onStep(int local_rank, uint64_t step, double now);
  void onExit(int local_rank, double now, double cpu_seconds, int64_t peak_rss_kb);
  const std::vector<RankProgress>& ranks() const { return ranks_; }

  // A header and one row per rank (global and local rank, wall, steps, mean step, CPU time,
  // mean CPU%, peak memory; one word each, "-" when unknown), then advice
  // where the figures point to a cause. `cores`: CPUs this node may use; `threads_per_rank`:
  // OMP_NUM_THREADS as the workers got it (0: unknown).
  std::string summary(double now, int cores, int threads_per_rank) const;

 private:
  std::vector<RankProgress> ranks_;
};

}  // namespace ddpl::launcher
