#include "launcher/progress.h"

#include "launcher/job_view.h"

#include <fmt/format.h>

#include <algorithm>

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
  if (r.recent.size() > 256) r.recent.erase(r.recent.begin(), r.recent.begin() + 128);
}

std::string Straggler::describe() const {
  return fmt::format(
      "rank {} (local rank {}) takes {:.1f} ms of its own per step against the median rank's "
      "{:.1f} ms (+{:.0f}%) over its last {} steps",
      global_rank, local_rank, own_ms, median_ms, 100 * (own_ms / median_ms - 1), steps);
}

std::vector<Straggler> ProgressTracker::newStragglers(double ratio, size_t window,
                                                      double min_gap_ms) {
  // Per rank: milliseconds per step of its own over the window (from the newest sample back to
  // the first sample at least `window` steps older).
  std::vector<double> own(ranks_.size(), -1);
  std::vector<int> steps(ranks_.size(), 0);
  for (size_t i = 0; i < ranks_.size(); ++i) {
    const auto& rec = ranks_[i].recent;
    if (rec.size() < 2) continue;  // a rank that has finished still counts, by its last steps
    const auto& last = rec.back();
    const RankProgress::Sample* first = nullptr;
    for (auto it = rec.rbegin(); it != rec.rend(); ++it)
      if (last.step - it->step >= window) {
        first = &*it;
        break;
      }
    if (!first) continue;
    double n = static_cast<double>(last.step - first->step);
    double wall_ms = (last.time - first->time) * 1000 / n;
    double wait_ms = static_cast<double>(last.waited_us - first->waited_us) / 1000 / n;
    own[i] = std::max(0.0, wall_ms - wait_ms);
    steps[i] = static_cast<int>(n);
  }
  std::vector<double> known;
  for (double v : own)
    if (v >= 0) known.push_back(v);
  std::vector<Straggler> out;
  if (known.size() < 2 || known.size() < ranks_.size()) return out;  // every rank measured
  std::sort(known.begin(), known.end());
  double median = known[(known.size() - 1) / 2];  // the lower median: ties go to the majority
  for (size_t i = 0; i < ranks_.size(); ++i) {
    RankProgress& r = ranks_[i];
    if (r.straggler || own[i] < 0) continue;
    if (own[i] > ratio * median && own[i] - median > min_gap_ms) {
      Straggler s{r.local_rank, r.global_rank, own[i], median, steps[i]};
      r.straggler = true;
      r.straggler_why = s.describe();
      out.push_back(s);
    }
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
  } else if (r.step == 0 && (wrote_output || (r.cpu >= 0 && cpu_seconds > r.cpu + 1e-3))) {
    r.last_progress = now;  // no steps reported: CPU time or output is progress
  }
  r.cpu = cpu_seconds;
}

void HangDetector::onExit(int local_rank) {
  if (local_rank >= 0 && local_rank < static_cast<int>(ranks_.size()))
    ranks_[local_rank].alive = false;
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
  bool someone_steps = std::any_of(ranks_.begin(), ranks_.end(), [](const Rank& r) { return r.step > 0; });
  for (size_t i = 0; i < ranks_.size(); ++i) {
    Rank& r = ranks_[i];
    if (!r.alive || r.reported) continue;
    Hang h;
    h.local_rank = static_cast<int>(i);
    if (r.step > 0) {
      h.limit_sec = limitFor(h.local_rank);
      h.idle_sec = now - r.last_progress;
      h.why = fmt::format("no step for {:.1f}s (limit {:.1f}s) after step {}", h.idle_sec,
                          h.limit_sec, r.step);
    } else if (someone_steps && now - r.started > options_.first_step_timeout_sec) {
      h.limit_sec = options_.first_step_timeout_sec;
      h.idle_sec = now - r.started;
      h.why = fmt::format("no first step {:.1f}s after start (limit {:.1f}s) while other ranks "
                          "report steps",
                          h.idle_sec, h.limit_sec);
    } else if (options_.timeout_sec) {
      h.limit_sec = *options_.timeout_sec;
      h.idle_sec = now - r.last_progress;
      h.why = fmt::format("no CPU time and no output for {:.1f}s (limit {:.1f}s)", h.idle_sec,
                          h.limit_sec);
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
