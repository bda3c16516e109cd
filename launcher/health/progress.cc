#include "launcher/health/progress.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "common/bytes.h"

namespace ddpl::launcher {

std::optional<double> RankProgress::meanStepSeconds() const {
  if (!first_beat || step <= first_step) return std::nullopt;
  return (last_change - *first_beat) / static_cast<double>(step - first_step);
}

void ProgressTracker::start(int nproc, int rank_offset, double now) {
  ranks_.assign(static_cast<size_t>(nproc), RankProgress{});
  for (int lr = 0; lr < nproc; ++lr) {
    ranks_[lr].local_rank = lr;
    ranks_[lr].global_rank = rank_offset + lr;
    ranks_[lr].started = now;
  }
}

void ProgressTracker::onStep(int local_rank, uint64_t step, double now, uint64_t waited_us) {
  if (local_rank < 0 || local_rank >= static_cast<int>(ranks_.size())) return;
  RankProgress& r = ranks_[local_rank];
  if (step == 0 || step == r.step) return;
  if (!r.first_beat) {
    r.first_beat = now;
    r.first_step = step;
  }
  r.step = step;
  r.last_change = now;
  r.recent.push_back({now, step, waited_us});
  // Bounded, yet long enough for the straggler windows at any --monitor-interval: every other
  // reading of the older half goes (two intervals become one, with the same own time per step).
  constexpr size_t kKeep = 4096;
  if (r.recent.size() > kKeep) {
    size_t out = 1;
    for (size_t in = 2; in < kKeep / 2; in += 2) r.recent[out++] = r.recent[in];
    r.recent.erase(r.recent.begin() + static_cast<std::ptrdiff_t>(out),
                   r.recent.begin() + static_cast<std::ptrdiff_t>(kKeep / 2));
  }
}

std::string Straggler::describe() const {
  std::string more =
      median_ms > 0 ? fmt::format(" (+{:.0f}%)", 100 * (own_ms / median_ms - 1)) : "";
  return fmt::format(
      "rank {} (local rank {}) takes {:.1f} ms of its own per step against the median rank's "
      "{:.1f} ms{} over its last {} steps{}",
      global_rank, local_rank, own_ms, median_ms, more, steps,
      windows > 1 ? fmt::format(", slower in each of {} windows of {}", windows, steps / windows)
                  : "");
}

namespace {
// The median of values with weights: the value at which half the weight lies on either side.
double weightedMedian(std::vector<std::pair<double, double>> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  double total = 0;
  for (const auto& [value, weight] : v) total += weight;
  double seen = 0;
  for (const auto& [value, weight] : v)
    if ((seen += weight) >= total / 2) return value;
  return v.back().first;
}

// The lower median: with an even count, ties go to the majority of equal ranks.
double lowerMedian(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[(v.size() - 1) / 2];
}
}  // namespace

std::vector<Straggler> ProgressTracker::newStragglers(const StragglerOptions& o) {
  std::vector<Straggler> out;
  const size_t n = ranks_.size();
  const size_t windows = static_cast<size_t>(std::max(1, o.windows));
  if (n < 2) return out;
  std::vector<uint64_t> history(n, 0);  // steps its readings span
  std::vector<double> pace;             // seconds per step
  bool all_ended = true;
  for (size_t i = 0; i < n; ++i) {
    const auto& rec = ranks_[i].recent;
    all_ended = all_ended && ranks_[i].ended.has_value();
    if (rec.size() < 2 || rec.back().step <= rec.front().step) return out;  // every rank measured
    history[i] = rec.back().step - rec.front().step;
    pace.push_back((rec.back().time - rec.front().time) / static_cast<double>(history[i]));
  }
  // Window length in steps: enough steps, and enough time at the median rank's pace. The steps
  // are a worker's word: one that jumps by 2^64 in a tick asks for more steps than a size_t
  // holds (converting that was undefined), hence the cap; nothing below multiplies it before
  // it is known to fit the steps made.
  constexpr double kMaxWindowSteps = 1e18;
  double median_pace = lowerMedian(pace);
  size_t length = o.window_steps;
  if (median_pace > 0)
    length = std::max(length, static_cast<size_t>(
                                  std::min(std::ceil(o.window_sec / median_pace), kMaxWindowSteps)));
  uint64_t shortest = *std::min_element(history.begin(), history.end());
  if (shortest / windows < length) {
    // Too few steps yet. A finished run is judged on what it made.
    if (!all_ended || shortest / windows < o.final_window_steps) return out;
    length = static_cast<size_t>(shortest / windows);
  }
  // Per rank and window (the oldest first), then over all of them, two figures of its own time
  // per step: the mean (where in a step launch happened to read cancels out, but an outlier step
  // pulls it) and the median between readings (which outlier steps do not move, but which
  // varies with where the readings fell). A slower rank is slower by both.
  struct Own {
    double mean = 0, median = 0;
  };
  std::vector<std::vector<Own>> own(windows + 1, std::vector<Own>(n));
  for (size_t i = 0; i < n; ++i) {
    // Between consecutive readings, newest first: the step time less the wait inside
    // collectives, per step (negative where a reading fell inside a wait), weighted by the steps
    // between them, in the window of the step it ends at.
    const auto& rec = ranks_[i].recent;
    const uint64_t last = rec.back().step;
    std::vector<std::vector<std::pair<double, double>>> parts(windows + 1);
    for (size_t k = rec.size() - 1; k > 0 && last - rec[k].step < windows * length; --k) {
      if (rec[k].step <= rec[k - 1].step) continue;
      double steps = static_cast<double>(rec[k].step - rec[k - 1].step);
      double waited = rec[k].waited_us >= rec[k - 1].waited_us
                          ? static_cast<double>(rec[k].waited_us - rec[k - 1].waited_us) / 1e6
                          : 0;
      std::pair<double, double> x{(rec[k].time - rec[k - 1].time - waited) / steps, steps};
      parts[windows - 1 - (last - rec[k].step) / length].push_back(x);
      parts[windows].push_back(x);
    }
    for (size_t w = 0; w <= windows; ++w) {
      double sum = 0, steps = 0;
      for (const auto& [value, weight] : parts[w]) {
        sum += value * weight;
        steps += weight;
      }
      own[w][i].mean = std::max(0.0, steps > 0 ? sum / steps : 0);
      own[w][i].median = std::max(0.0, weightedMedian(std::move(parts[w])));
    }
  }
  std::vector<Own> median(windows + 1);
  for (size_t w = 0; w <= windows; ++w) {
    std::vector<double> means, medians;
    for (const Own& x : own[w]) {
      means.push_back(x.mean);
      medians.push_back(x.median);
    }
    median[w] = {lowerMedian(means), lowerMedian(medians)};
  }
  auto above = [&](double value, double reference) {
    return value > o.ratio * reference && (value - reference) * 1000 > o.min_gap_ms;
  };
  for (size_t i = 0; i < n; ++i) {
    RankProgress& r = ranks_[i];
    if (r.straggler) continue;
    bool slower = true;
    for (size_t w = 0; w < windows && slower; ++w)
      slower = above(own[w][i].mean, median[w].mean) && above(own[w][i].median, median[w].median);
    if (!slower) continue;
    Straggler s{r.local_rank,
                r.global_rank,
                own[windows][i].mean * 1000,
                median[windows].mean * 1000,
                static_cast<int>(std::min<uint64_t>(windows * length, INT32_MAX)),
                static_cast<int>(windows)};
    r.straggler = true;
    r.straggler_why = s.describe();
    out.push_back(s);
  }
  return out;
}

void ProgressTracker::onExit(int local_rank, double now, double cpu_seconds, int64_t peak_rss_kb) {
  if (local_rank < 0 || local_rank >= static_cast<int>(ranks_.size())) return;
  RankProgress& r = ranks_[local_rank];
  r.ended = now;
  r.cpu_seconds = cpu_seconds;
  r.peak_rss_kb = peak_rss_kb;
}

void HangDetector::start(int nproc, double now) {
  ranks_.assign(static_cast<size_t>(nproc), Rank{});
  for (auto& r : ranks_) r.started = r.last_progress = now;
}

void HangDetector::observe(int local_rank, uint64_t step, double cpu_seconds, bool wrote_output,
                           double now) {
  if (local_rank < 0 || local_rank >= static_cast<int>(ranks_.size())) return;
  Rank& r = ranks_[local_rank];
  if (step != r.step) {
    // The first step's duration includes start-up: only later ones set the automatic limit.
    if (r.step > 0 && step > r.step)
      r.slowest_step = std::max(r.slowest_step, (now - r.last_progress) / double(step - r.step));
    r.step = step;
    r.last_progress = now;
    r.finished_at.reset();  // stepping again
  }
  if (wrote_output) r.last_output = now;
  r.cpu = std::max(r.cpu, cpu_seconds);  // a /proc that cannot be read any more reads 0
  if (!options_.timeout_sec || *options_.timeout_sec <= 0) return;
  // Readings over the last window: one per 1/64 of it is plenty for a rate (the newest moves
  // forward in between); the newest at or before its start is the base.
  const double window = *options_.timeout_sec;
  auto& s = r.cpu_samples;
  if (s.size() >= 2 && now - s[s.size() - 2].time < window / 64)
    s.back() = {now, r.cpu};
  else
    s.push_back({now, r.cpu});
  while (s.size() > 2 && s[1].time <= now - 1.1 * window) s.pop_front();  // some to spare
}

std::optional<bool> HangDetector::worked(const Rank& r, double now, double* cpu_used,
                                         double* span) const {
  if (!options_.timeout_sec || r.cpu_samples.empty()) return std::nullopt;
  const double window = *options_.timeout_sec;
  // The base: the newest reading at or before the window's start.
  const CpuSample* found = nullptr;
  for (const auto& c : r.cpu_samples)
    if (c.time <= now - window) found = &c;
  if (!found) return std::nullopt;  // not watched for a whole window yet
  const CpuSample& base = *found;
  double used = r.cpu - base.cpu;
  if (cpu_used) *cpu_used = used;
  if (span) *span = now - base.time;
  if (r.last_output && now - *r.last_output < window) return true;
  if (r.step > 0 && now - r.last_progress < window) return true;
  return used >=
         std::max(options_.idle_cpu_fraction * (now - base.time), options_.idle_cpu_floor_sec);
}

void HangDetector::onExit(int local_rank) {
  if (local_rank >= 0 && local_rank < static_cast<int>(ranks_.size()))
    ranks_[local_rank].alive = false;
}

void HangDetector::onFinished(int local_rank, double now) {
  if (local_rank < 0 || local_rank >= static_cast<int>(ranks_.size())) return;
  Rank& r = ranks_[local_rank];
  if (!r.finished_at) r.finished_at = now;
}

double HangDetector::limitFor(int local_rank) const {
  if (local_rank < 0 || local_rank >= static_cast<int>(ranks_.size())) return 0;
  const Rank& r = ranks_[local_rank];
  if (options_.timeout_sec) return *options_.timeout_sec;
  if (r.step == 0) return 0;
  return std::max(options_.auto_floor_sec, options_.auto_multiple * r.slowest_step);
}

std::vector<Hang> HangDetector::check(double now) {
  std::vector<Hang> out;
  bool someone_steps =
      std::any_of(ranks_.begin(), ranks_.end(), [](const Rank& r) { return r.step > 0; });
  // Ranks without steps wait for one another: while any rank of the node works (or has not
  // been watched for a whole window yet), an idle one is taken to wait for it, not to hang. A
  // finishing rank counts as working: the others may wait for it in its teardown (a barrier
  // in destroy_process_group), and its own limit bounds that.
  bool node_works = std::any_of(ranks_.begin(), ranks_.end(), [&](const Rank& r) {
    auto w = worked(r, now);
    return r.alive && (r.finished_at || !w || *w);
  });
  for (size_t i = 0; i < ranks_.size(); ++i) {
    Rank& r = ranks_[i];
    if (!r.alive || r.reported) continue;
    Hang h;
    h.local_rank = static_cast<int>(i);
    if (r.finished_at) {
      h.limit_sec = std::max(options_.finish_timeout_sec, limitFor(h.local_rank));
      h.idle_sec = now - *r.finished_at;
      h.why = fmt::format(
          "not exited {:.1f}s after reporting its last step, step {} (limit {:.1f}s for "
          "teardown)",
          h.idle_sec, r.step, h.limit_sec);
    } else if (r.step > 0) {
      h.limit_sec = limitFor(h.local_rank);
      h.idle_sec = now - r.last_progress;
      h.why = fmt::format("no step for {:.1f}s (limit {:.1f}s) after step {}", h.idle_sec,
                          h.limit_sec, r.step);
    } else if (someone_steps && now - r.started > options_.first_step_timeout_sec) {
      h.limit_sec = options_.first_step_timeout_sec;
      h.idle_sec = now - r.started;
      h.why = fmt::format(
          "no first step {:.1f}s after start (limit {:.1f}s) while other ranks "
          "report steps",
          h.idle_sec, h.limit_sec);
    } else if (options_.timeout_sec) {
      double used = 0, span = 0;
      auto w = worked(r, now, &used, &span);
      if (!w || *w || node_works) continue;
      h.limit_sec = *options_.timeout_sec;
      h.idle_sec = span;
      h.why = fmt::format("no CPU time and no output for {:.1f}s (limit {:.1f}s)", h.idle_sec,
                          h.limit_sec);
      if (used > 0)
        h.why += fmt::format(
            " but an idle rank's {:.0f} ms of CPU ({:.2f}% of a core; work is "
            "{:.0f}% or more)",
            used * 1000, 100 * used / span,
            100 * std::max(options_.idle_cpu_fraction, options_.idle_cpu_floor_sec / span));
      r.reported = true;  // idle over a whole window (which may be exactly the limit long)
      out.push_back(std::move(h));
      continue;
    } else {
      continue;
    }
    if (h.limit_sec > 0 && h.idle_sec > h.limit_sec) {
      r.reported = true;
      out.push_back(std::move(h));
    }
  }
  return out;
}

namespace {
std::string duration(double s) {
  if (s < 1) return fmt::format("{:.0f}ms", s * 1000);
  if (s < 120) return fmt::format("{:.1f}s", s);
  return fmt::format("{}m{:02d}s", static_cast<int>(s) / 60, static_cast<int>(s) % 60);
}
std::string memory(int64_t kb) { return humanBytes(kb * 1024); }
}  // namespace

void ProgressTracker::onGpu(int local_rank, std::optional<double> util_percent,
                            std::optional<int64_t> bytes) {
  if (local_rank < 0 || local_rank >= static_cast<int>(ranks_.size())) return;
  RankProgress& r = ranks_[local_rank];
  if (util_percent) {
    r.gpu_util_sum += *util_percent;
    ++r.gpu_util_samples;
  }
  if (bytes) r.peak_gpu_bytes = std::max(r.peak_gpu_bytes, *bytes);
}

std::string ProgressTracker::summary(double now, int cores, int threads_per_rank) const {
  if (ranks_.empty()) return "";
  bool gpus = std::any_of(ranks_.begin(), ranks_.end(), [](const RankProgress& r) {
    return r.gpu_util_samples > 0 || r.peak_gpu_bytes >= 0;
  });
  auto gpuUtil = [](const RankProgress& r) -> std::optional<double> {
    if (r.gpu_util_samples == 0) return std::nullopt;
    return r.gpu_util_sum / r.gpu_util_samples;
  };
  std::string out = fmt::format("{:>6} {:>6} {:>9} {:>8} {:>10} {:>9} {:>6} {:>10}", "rank",
                                "local", "wall", "steps", "mean step", "CPU", "CPU%", "peak mem");
  out += gpus ? fmt::format(" {:>6} {:>13}\n", "GPU%", "peak GPU mem") : "\n";
  std::vector<int64_t> peaks;
  for (const auto& r : ranks_) {
    double wall = r.ended.value_or(now) - r.started;
    auto mean = r.meanStepSeconds();
    double cpu_pct = wall > 0 ? 100 * r.cpu_seconds / wall : 0;
    out += fmt::format("{:>6} {:>6} {:>9} {:>8} {:>10} {:>9} {:>5.0f}% {:>10}", r.global_rank,
                       r.local_rank, duration(wall), r.first_beat ? std::to_string(r.step) : "-",
                       mean ? duration(*mean) : "-", r.ended ? duration(r.cpu_seconds) : "-",
                       r.ended ? cpu_pct : 0.0, r.ended ? memory(r.peak_rss_kb) : "-");
    if (gpus) {
      auto util = gpuUtil(r);
      out += fmt::format(" {:>6} {:>13}", util ? fmt::format("{:.0f}%", *util) : "-",
                         r.peak_gpu_bytes >= 0 ? humanBytes(r.peak_gpu_bytes) : "-");
    }
    out += "\n";
    if (r.ended) peaks.push_back(r.peak_rss_kb);
  }
  for (const auto& r : ranks_)
    if (r.straggler) out += "straggler: " + r.straggler_why + "\n";
  if (threads_per_rank > 1 && cores > 0 &&
      threads_per_rank * static_cast<int>(ranks_.size()) > cores)
    out += fmt::format(
        "advice: {} ranks x OMP_NUM_THREADS={} is {} threads on {} cores: they slow each other "
        "down; lower OMP_NUM_THREADS to {}\n",
        ranks_.size(), threads_per_rank, threads_per_rank * static_cast<int>(ranks_.size()), cores,
        std::max(1, cores / static_cast<int>(ranks_.size())));
  for (const auto& r : ranks_) {
    // A GPU that waits while its rank's main thread is busy all the time: the input pipeline
    // (decoding, augmentation in the main process) cannot keep up.
    auto util = gpuUtil(r);
    double wall = r.ended.value_or(now) - r.started;
    if (util && *util < 50 && r.ended && wall > 0 && r.cpu_seconds / wall >= 0.9)
      out += fmt::format(
          "advice: rank {}'s GPU was busy {:.0f}% of the time while its process used {:.0f}% "
          "CPU: the input pipeline is the bottleneck; use DataLoader workers (num_workers), "
          "pin_memory and prefetching\n",
          r.global_rank, *util, 100 * r.cpu_seconds / wall);
  }
  if (peaks.size() >= 2) {
    std::vector<int64_t> sorted = peaks;
    std::sort(sorted.begin(), sorted.end());
    int64_t median = sorted[sorted.size() / 2];
    for (const auto& r : ranks_)
      if (r.ended && median > 0 && r.peak_rss_kb > 2 * median && r.peak_rss_kb - median > 262144)
        out += fmt::format(
            "advice: rank {} peaked at {}, more than twice the median rank's {}: look for data "
            "or caches only that rank holds (rank 0 logging, evaluation, a sampler)\n",
            r.global_rank, memory(r.peak_rss_kb), memory(median));
  }
  return out;
}

}  // namespace ddpl::launcher
