#pragma once
// What each worker of an attempt did, for the end-of-run summary: steps from its heartbeat
// (common/heartbeat.h), CPU time and peak memory from its exit (wait4's rusage). Pure: the agent
// feeds it observations with their times, so it is unit-tested without processes.
#include <algorithm>
#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <vector>

namespace ddpl::launcher {

struct RankProgress {
  int local_rank = 0;
  int global_rank = 0;
  double started = 0;                // seconds (any clock, the same for every call)
  std::optional<double> ended;       // when it exited
  uint64_t step = 0;                 // last step it reported
  std::optional<double> first_beat;  // when a step was first seen
  double last_change = 0;            // when the step last changed
  uint64_t first_step = 0;           // the step first seen
  double cpu_seconds = 0;            // user + system, at exit
  int64_t peak_rss_kb = 0;           // at exit
  // Step changes (time, step, microseconds waited in collectives so far), newest last; the
  // older ones thinned out as they accumulate (a wider gap between two readings measures the
  // same own time per step).
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
  double own_ms = 0;     // per step, over the steps judged
  double median_ms = 0;  // the median rank's
  int steps = 0;         // the steps judged
  int windows = 1;       // it was slower in each of this many parts of them
  std::string describe() const;
};

// How stragglers are judged (issue 33). On a shared machine any rank is slowed now and then (a
// descheduling, another process on its core for a few seconds, an outlier step): over 20 steps
// (0.3 s) one rank of a balanced job looked 24-77% slower in 8 of 27 runs. So a rank is named
// only when it is slower in each of `windows` consecutive windows, each of at least
// `window_steps` steps and `window_sec` seconds, by a statistic that outlier steps do not move:
// the median of its own time per step between heartbeat readings.
struct StragglerOptions {
  double ratio = 1.2;        // own time per step above the median rank's by this factor
  double min_gap_ms = 2;     // and by at least this much
  size_t window_steps = 20;  // each window: at least this many steps
  double window_sec = 5;     // and this long at the median rank's pace
  int windows = 3;           // slower in each of this many consecutive windows
  // Once every rank has exited, a run too short for that is judged in `windows` equal parts of
  // the steps it made, each of at least this many steps.
  size_t final_window_steps = 5;
};

// When a rank counts as hung (issue 18). Pure: fed observations with their times.
struct HangOptions {
  // Set (--hang-timeout): no progress for this long is a hang, for every rank; progress is a
  // new step for a rank that reports steps; for one that never has, output, or CPU time at more
  // than an idle rank's rate (below), while no rank of the node works (an idle rank waits for
  // the one that works). Unset: only ranks that report steps are watched, with an automatic
  // limit.
  std::optional<double> timeout_sec;
  bool on() const { return !timeout_sec || *timeout_sec > 0; }  // not --hang-timeout=0
  // A rank idles while it uses less than this fraction of one core. An idle rank is not silent
  // to the kernel: idle Python+Gloo ranks (asleep, or waiting in an all-reduce) measured here
  // used 0.13-0.23% of a core over 30-90 s, and at most 0.51% over any 6 s, from interpreter
  // and library thread wake-ups that /proc counts in 10 ms ticks (issue 33: counting any tick
  // as progress never found them). 2% is four times that worst window; a rank that does any
  // work (a training step, data loading, a Python loop) uses far more.
  double idle_cpu_fraction = 0.02;
  // ...or less than this much CPU time over the window, whichever is more: a window of a second
  // or two would otherwise be crossed by two or three 10 ms ticks.
  double idle_cpu_floor_sec = 0.05;
  // A rank with no step yet, while another rank of the node has reported one: hung after this
  // long from its start (model loading takes time).
  double first_step_timeout_sec = 1800;
  // The automatic limit: this many times the slowest step seen, never below the floor.
  double auto_multiple = 10;
  double auto_floor_sec = 600;
  // A rank that reported its last step (common/heartbeat.h kHeartbeatFinishedOffset:
  // ddplaunch.done(), or the interpreter's exit) is tearing down (a final save, destroying its
  // process groups, the interpreter's exit), which no step follows and which takes seconds
  // on a loaded machine: no rule above applies to it any more. It is hung only when it has not
  // exited this long after (--hang-finish-timeout), or after its limit while it stepped where
  // that is longer: teardown stuck for good is still found.
  double finish_timeout_sec = 600;

  // The soonest a rank of a group that just started can be found hung, by any of the rules
  // above (0: --hang-timeout=0, hangs are not looked for).
  double soonestLimitSec() const {
    return std::min(timeout_sec.value_or(auto_floor_sec), first_step_timeout_sec);
  }
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
  // The rank's heartbeat says it made its last step (HeartbeatChannel::finishedStepping); it
  // is finishing from the first such call until a new step. Call it after observe().
  void onFinished(int local_rank, double now);
  // Ranks past their limit now, each reported once per start().
  std::vector<Hang> check(double now);
  // The limit a stepping rank has now (for the log); 0 when it is not watched.
  double limitFor(int local_rank) const;

 private:
  struct CpuSample {
    double time;
    double cpu;
  };
  struct Rank {
    double started = 0;
    double last_progress = 0;
    uint64_t step = 0;
    double cpu = -1;
    double slowest_step = 0;
    std::optional<double> last_output;
    std::optional<double> finished_at;  // when its last step was first seen reported as such
    // With a timeout: CPU seconds so far at times over the last timeout window, the oldest at
    // or before its start (the base of the rate), newest last.
    std::deque<CpuSample> cpu_samples;
    bool alive = true;
    bool reported = false;
  };
  // Whether `r` did work over the last timeout window: a step, output, or CPU time above an
  // idle rank's; `cpu_used`/`span`: the CPU time over the window and its length. Nullopt until
  // the rank has been watched for a whole window.
  std::optional<bool> worked(const Rank& r, double now, double* cpu_used = nullptr,
                             double* span = nullptr) const;
  HangOptions options_;
  std::vector<Rank> ranks_;
};

class ProgressTracker {
 public:
  void start(int nproc, int rank_offset, double now);
  void onStep(int local_rank, uint64_t step, double now, uint64_t waited_us = 0);
  // Ranks that have become stragglers since the last call (each reported once per attempt),
  // judged over their last windows once every rank has made them; once every rank has exited,
  // over the steps they made.
  std::vector<Straggler> newStragglers(const StragglerOptions& options = {});
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
