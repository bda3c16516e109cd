#include "launcher/health/job_view.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "common/bytes.h"

namespace ddpl::launcher {
namespace {

std::string duration(double sec) {
  auto s = static_cast<int64_t>(sec);
  if (s < 60) return fmt::format("{}s", s);
  if (s < 3600) return fmt::format("{}m{:02}s", s / 60, s % 60);
  return fmt::format("{}h{:02}m", s / 3600, (s % 3600) / 60);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// Per-rank figures in one word each: every rank when there are few, else the range and the
// median (a 64-rank node would not fit a line).
template <typename T, typename Fmt>
std::string perRank(const std::vector<std::optional<T>>& values, size_t list_up_to, Fmt fmt1) {
  std::vector<T> known;
  for (const auto& v : values)
    if (v) known.push_back(*v);
  if (known.empty()) return "";
  if (values.size() <= list_up_to) {
    std::string out;
    for (const auto& v : values) out += (out.empty() ? "" : " ") + (v ? fmt1(*v) : "-");
    return out;
  }
  std::sort(known.begin(), known.end());
  return fmt::format("{}..{} (median {})", fmt1(known.front()), fmt1(known.back()),
                     fmt1(known[known.size() / 2]));
}

// `compact`: the status line's short forms; otherwise the log line's words.
std::string render(const JobFigures& f, size_t list_up_to, const char* sep, bool compact) {
  std::string out = fmt::format("{}/{} ranks up {}", f.alive, f.total, duration(f.uptime_sec));
  if (f.stepping) {
    out += fmt::format("{}step {}", sep, f.step);
    if (f.steps_per_sec) out += fmt::format(" ({:.3g}/s)", *f.steps_per_sec);
    if (f.slowest_global_rank)
      out += fmt::format(compact ? "{}slowest r{} {:.0f}ms (median {:.0f})"
                                 : "{}slowest rank {} {:.1f} ms/step (median rank {:.1f})",
                         sep, *f.slowest_global_rank, f.slowest_ms, f.median_ms);
  }
  auto bytes = [compact](int64_t b) { return compact ? shortBytes(b) : humanBytes(b); };
  auto pct = [](double v) { return fmt::format("{:.0f}", v); };
  std::string cpu = perRank(f.cpu_percent, list_up_to, pct);
  if (!cpu.empty()) out += fmt::format("{}cpu% {}", sep, cpu);
  std::vector<std::optional<int64_t>> rss;
  for (int64_t b : f.rss_bytes) rss.push_back(b >= 0 ? std::optional<int64_t>(b) : std::nullopt);
  std::string mem = perRank(rss, list_up_to, bytes);
  if (!mem.empty()) out += fmt::format("{}mem {}", sep, mem);
  std::string gpu = perRank(f.gpu_util_percent, list_up_to, pct);
  if (!gpu.empty()) out += fmt::format("{}gpu% {}", sep, gpu);
  std::string gmem = perRank(f.gpu_memory_bytes, list_up_to, bytes);
  if (!gmem.empty()) out += fmt::format("{}gpu mem {}", sep, gmem);
  std::string ckpt = perRank(f.checkpoint_bytes, list_up_to, bytes);
  if (!ckpt.empty()) out += fmt::format("{}ckpt mem {}", sep, ckpt);
  return out;
}

}  // namespace

std::string fitColumns(const std::string& text, size_t columns) {
  size_t cols = 0, i = 0;
  bool escaped = false;
  while (i < text.size()) {
    auto c = static_cast<unsigned char>(text[i]);
    if (c == 0x1b) {  // CSI: ESC [ params final-byte (0x40..0x7e)
      escaped = true;
      size_t j = i + 1;
      if (j < text.size() && text[j] == '[') {
        ++j;
        while (j < text.size() && !(text[j] >= 0x40 && text[j] <= 0x7e)) ++j;
      }
      i = std::min(j + 1, text.size());
      continue;
    }
    size_t len = c < 0x80           ? 1
                 : (c >> 5) == 0x6  ? 2
                 : (c >> 4) == 0xe  ? 3
                 : (c >> 3) == 0x1e ? 4
                                    : 1;
    if (cols + 1 > columns) return text.substr(0, i) + (escaped ? "\x1b[0m" : "");
    i = std::min(i + len, text.size());
    ++cols;
  }
  return text;
}

void JobView::start(double now) {
  started_ = now;
  samples_.clear();
}

void JobView::sample(std::vector<RankUsage> ranks, double now) {
  samples_.push_back({now, std::move(ranks)});
  // Keep one sample at least window_sec old, as the base of the rates.
  while (samples_.size() > 2 && now - samples_[1].time >= window_sec_) samples_.pop_front();
}

JobFigures JobView::figures() const {
  JobFigures f;
  if (samples_.empty()) return f;
  const Sample& last = samples_.back();
  const Sample& base = samples_.front();
  double dt = last.time - base.time;
  f.total = static_cast<int>(last.ranks.size());
  f.uptime_sec = last.time - started_;
  uint64_t min_step = UINT64_MAX, base_min_step = UINT64_MAX;
  std::vector<double> ms_per_step;
  std::vector<int> ms_rank;
  for (size_t i = 0; i < last.ranks.size(); ++i) {
    const RankUsage& r = last.ranks[i];
    f.alive += r.alive;
    std::optional<double> cpu;
    const RankUsage* b = i < base.ranks.size() ? &base.ranks[i] : nullptr;
    if (r.alive && b && dt > 0) cpu = std::max(0.0, 100 * (r.cpu_seconds - b->cpu_seconds) / dt);
    f.cpu_percent.push_back(cpu);
    f.rss_bytes.push_back(r.alive ? r.rss_bytes : -1);
    f.gpu_util_percent.push_back(r.gpu_util_percent);
    f.gpu_memory_bytes.push_back(r.gpu_memory_bytes);
    f.checkpoint_bytes.push_back(r.checkpoint_bytes);
    if (r.step > 0) {
      f.stepping = true;
      min_step = std::min(min_step, r.step);
      if (b) base_min_step = std::min(base_min_step, b->step);
      if (b && r.step > b->step && dt > 0) {
        double waited = r.waited_us >= b->waited_us ? double(r.waited_us - b->waited_us) / 1e6 : 0;
        ms_per_step.push_back(1000 * std::max(0.0, dt - waited) /
                              static_cast<double>(r.step - b->step));
        ms_rank.push_back(r.global_rank);
      }
    }
  }
  if (f.stepping) {
    f.step = min_step;
    if (dt > 0 && base_min_step != UINT64_MAX && min_step >= base_min_step)
      f.steps_per_sec = static_cast<double>(min_step - base_min_step) / dt;
  }
  if (ms_per_step.size() >= 2) {
    auto worst = std::max_element(ms_per_step.begin(), ms_per_step.end());
    f.slowest_global_rank = ms_rank[static_cast<size_t>(worst - ms_per_step.begin())];
    f.slowest_ms = *worst;
    f.median_ms = median(ms_per_step);
  }
  return f;
}

std::string JobView::statusLine(size_t columns) const {
  return fitColumns("ddpl | " + render(figures(), 8, " | ", true), columns);
}

std::string JobView::logLine() const { return render(figures(), SIZE_MAX, "; ", false); }

}  // namespace ddpl::launcher
