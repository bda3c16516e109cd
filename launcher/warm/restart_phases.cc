#include "launcher/warm/restart_phases.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>

namespace ddpl::launcher::warm {

namespace {

double span(double a, double b) { return b > 0 && a > 0 ? std::max(0.0, b - a) : 0.0; }

uint64_t addSaturating(uint64_t a, uint64_t b) {
  return a > std::numeric_limits<uint64_t>::max() - b ? std::numeric_limits<uint64_t>::max()
                                                      : a + b;
}

// At most `bytes`, cut on a UTF-8 boundary (a cause may quote a worker's words).
std::string cut(std::string s, size_t bytes) {
  if (s.size() <= bytes) return s;
  size_t n = bytes;
  while (n > 0 && (static_cast<unsigned char>(s[n]) & 0xC0) == 0x80) --n;
  s.resize(n);
  return s + "...";
}

}  // namespace

RestoreSource restoreSourceFromCode(uint64_t code) {
  return code >= 1 && code <= 3 ? static_cast<RestoreSource>(code) : RestoreSource::kNone;
}

const char* restoreSourceName(RestoreSource s) {
  switch (s) {
    case RestoreSource::kMemory:
      return "memory";
    case RestoreSource::kPeer:
      return "peer";
    case RestoreSource::kDisk:
      return "disk";
    case RestoreSource::kNone:
      break;
  }
  return "none";
}

std::string RestartRecord::describe() const {
  std::string how;
  if (warm > 0 && cold > 0)
    how = fmt::format("{} warm, {} cold", warm, cold);
  else
    how = fmt::format("{} {}", warm + cold, warm > 0 ? "warm" : "cold");
  std::string s =
      fmt::format("stop {:.2f}s, re-form {:.2f}s, start {:.2f}s ({})", span(failed, stopped),
                  span(stopped, formed), span(formed, started), how);
  if (first_step > 0) {
    s += fmt::format(", first step {:.2f}s", span(started, first_step));
    if (restore > 0) s += fmt::format(" (checkpoint read {:.2f}s)", restore);
    s += fmt::format(": {:.2f}s in all", total());
  } else
    s += fmt::format(", no step completed: {:.2f}s to the start", total());
  return s;
}

uint64_t RestartRecord::recomputed() const {
  uint64_t from = restored.value_or(0);
  return before > from ? before - from : 0;
}

double RestartRecord::lost() const {
  double end = back > 0         ? back
               : ended > 0      ? ended
               : first_step > 0 ? first_step
               : started > 0    ? started
                                : failed;
  return std::max(0.0, end - failed) + std::max(0.0, detect);
}

void RestartClock::push(const RestartRecord& r) {
  done_.push_back(r);
  changed_ = true;
  while (done_.size() > kMaxKept) {
    ++dropped_;
    dropped_lost_ += done_.front().lost();
    if (done_.front().back == 0) dropped_open_ = true;
    done_.pop_front();
  }
}

void RestartClock::endBackWait(double t) {
  if (!back_open_) return;
  back_open_ = false;
  RestartRecord& r = done_.back();
  r.ended = std::max(t, r.failed);
  changed_ = true;
}

void RestartClock::onFailure(double t, std::string cause) {
  if (stage_ == Stage::kStarted) {  // a restarted group failed before all its ranks stepped
    stage_ = Stage::kNone;
    open_.first_step = 0;
    open_.ended = t;
    push(open_);
  }
  if (stage_ != Stage::kNone) return;
  double detect = last_step_ > 0 ? std::max(0.0, t - last_step_) : -1;
  // The row still waiting to be back loses its seconds up to where this one's begin.
  endBackWait(t - std::max(0.0, detect));
  open_ = RestartRecord{};
  open_.restart = restarts_ + 1;
  open_.cause = cut(std::move(cause), kMaxCauseBytes);
  open_.failed = t;
  open_.detect = detect;
  open_.before = highest_;
  stage_ = Stage::kFailed;
}

void RestartClock::onStopped(double t) {
  if (stage_ == Stage::kFailed) {
    open_.stopped = t;
    stage_ = Stage::kStopped;
  }
}

void RestartClock::onFormed(double t) {
  if (stage_ == Stage::kStopped || stage_ == Stage::kFailed) {
    if (open_.stopped == 0) open_.stopped = t;
    open_.formed = t;
    stage_ = Stage::kFormed;
  }
}

void RestartClock::startGroup() {
  last_count_.clear();
  mode_.clear();
  last_step_ = 0;
  highest_ = 0;
}

void RestartClock::onStarted(double t, int warm, int cold) {
  if (stage_ == Stage::kNone || stage_ == Stage::kFormed) startGroup();
  if (first_started_ == 0) first_started_ = t;
  if (stage_ != Stage::kFormed) return;
  open_.started = t;
  open_.warm = warm;
  open_.cold = cold;
  ++restarts_;
  stage_ = Stage::kStarted;
}

namespace {

// The step the group restored (the lowest any rank names) and the farthest source.
void noteRestore(RestartRecord& r, const std::vector<RankSteps>& ranks) {
  for (const auto& k : ranks) {
    if (k.restored == 0) continue;
    uint64_t step = k.restored - 1;
    if (!r.restored || step < *r.restored) r.restored = step;
    if (static_cast<int>(k.source) > static_cast<int>(r.source)) r.source = k.source;
  }
}

}  // namespace

uint64_t RestartClock::globalStep(size_t i, const RankSteps& k) const {
  return mode_[i] == 2 ? addSaturating(k.restored - 1, k.steps) : k.steps;
}

void RestartClock::trackGroup(double t, const std::vector<RankSteps>& ranks) {
  if (last_count_.size() < ranks.size()) {
    last_count_.resize(ranks.size(), 0);
    mode_.resize(ranks.size(), 0);
  }
  for (size_t i = 0; i < ranks.size(); ++i) {
    const RankSteps& k = ranks[i];
    if (k.steps != last_count_[i] && k.steps > 0) last_step_ = t;
    last_count_[i] = k.steps;
    if (k.steps == 0) continue;
    if (mode_[i] == 0) mode_[i] = k.restored == 0 || k.steps > k.restored - 1 ? 1 : 2;
    highest_ = std::max(highest_, globalStep(i, k));
  }
}

std::optional<RestartRecord> RestartClock::onReadings(double t, const std::vector<RankSteps>& ranks,
                                                      double restore_seconds) {
  trackGroup(t, ranks);
  // The failed group's last words count: a survivor may step once more before it is stopped.
  if (stage_ == Stage::kFailed || stage_ == Stage::kStopped)
    open_.before = std::max(open_.before, highest_);
  bool first = false;
  if (stage_ == Stage::kStarted && !ranks.empty()) {
    noteRestore(open_, ranks);
    if (std::none_of(ranks.begin(), ranks.end(), [](const RankSteps& k) { return k.steps == 0; })) {
      open_.first_step = t;
      open_.restore = restore_seconds;
      stage_ = Stage::kNone;
      push(open_);
      back_open_ = true;
      first = true;
    }
  }
  if (back_open_ && !ranks.empty()) {
    RestartRecord& r = done_.back();
    noteRestore(r, ranks);
    // The group is back when its slowest rank is: every rank's global step at `before`.
    bool all = true;
    uint64_t lowest = std::numeric_limits<uint64_t>::max();
    for (size_t i = 0; i < ranks.size(); ++i) {
      if (mode_[i] == 0) {
        all = false;
        break;
      }
      lowest = std::min(lowest, globalStep(i, ranks[i]));
    }
    if (all && lowest >= r.before) {
      r.back = t;
      back_open_ = false;
      changed_ = true;
    }
  }
  if (first) return done_.back();
  return std::nullopt;
}

std::optional<RestartRecord> RestartClock::onGroupEnded(double t) {
  endBackWait(t);
  if (stage_ != Stage::kStarted) return std::nullopt;
  stage_ = Stage::kNone;
  open_.ended = t > 0 ? t : open_.started;
  push(open_);
  return open_;
}

std::string RestartClock::summary() const {
  std::string s;
  for (const auto& r : done_) s += fmt::format("\n  restart {}: {}", r.restart, r.describe());
  return s;
}

std::string RestartClock::incidentTable(double wall_seconds, size_t max_rows) const {
  if (done_.empty() && dropped_ == 0) return "";
  auto secs = [](double v) { return fmt::format("{:.2f}", v); };
  std::vector<std::vector<std::string>> rows{{"#", "detect", "stop", "re-form", "start",
                                              "first step", "restore", "recomputed", "back", "lost",
                                              "cause"}};
  size_t shown = std::min(max_rows, done_.size());
  double lost = dropped_lost_;
  bool open = dropped_open_;
  for (size_t i = 0; i < done_.size(); ++i) {
    const RestartRecord& r = done_[i];
    lost += r.lost();
    if (r.back == 0) open = true;
    if (i < done_.size() - shown) continue;
    std::string restore = "none";
    if (r.restored) {
      restore = fmt::format("{} step {}", restoreSourceName(r.source), *r.restored);
      if (r.restore > 0) restore += fmt::format(" in {:.2f}s", r.restore);
    }
    bool stepped = r.first_step > 0 || r.restored;
    rows.push_back({std::to_string(r.restart), r.detect >= 0 ? secs(r.detect) : "-",
                    secs(span(r.failed, r.stopped)), secs(span(r.stopped, r.formed)),
                    secs(span(r.formed, r.started)),
                    r.first_step > 0 ? secs(span(r.started, r.first_step)) : "-", restore,
                    stepped ? std::to_string(r.recomputed()) : "-",
                    r.back > 0 ? secs(r.back - r.failed) : (r.complete() ? "not back" : "pending"),
                    (r.back > 0 ? "" : ">=") + secs(r.lost()), r.cause.empty() ? "-" : r.cause});
  }
  std::vector<size_t> width(rows[0].size(), 0);
  for (const auto& row : rows)
    for (size_t c = 0; c < row.size(); ++c) width[c] = std::max(width[c], row[c].size());
  std::string s =
      "where each lost second went (seconds; detect counts from the last step a rank of this "
      "node completed; back: from the failure until the group's step was again the highest "
      "before it; lost = detect + back):";
  size_t hidden = dropped_ + done_.size() - shown;
  if (hidden > 0) s += fmt::format("\n  {} earlier incident(s) not shown", hidden);
  for (const auto& row : rows) {
    s += "\n ";
    for (size_t c = 0; c < row.size(); ++c)
      s += c + 1 < row.size() ? fmt::format(" {:<{}}", row[c], width[c]) : " " + row[c];
  }
  size_t incidents = dropped_ + done_.size();
  s += fmt::format("\n  totals: {} incident{}, {}{:.2f}s lost", incidents,
                   incidents == 1 ? "" : "s", open ? "at least " : "", lost);
  if (wall_seconds > 0)
    s += fmt::format(" ({:.1f}% of {:.1f}s wall time)", 100 * lost / wall_seconds, wall_seconds);
  return s;
}

}  // namespace ddpl::launcher::warm
