#include "launcher/warm/restart_phases.h"

#include <fmt/format.h>

#include <algorithm>

namespace ddpl::launcher::warm {

std::string RestartRecord::describe() const {
  auto span = [](double a, double b) { return b > 0 && a > 0 ? std::max(0.0, b - a) : 0.0; };
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

void RestartClock::onFailure(double t) {
  if (stage_ == Stage::kStarted) {  // a restarted group failed before all its ranks stepped
    stage_ = Stage::kNone;
    open_.first_step = 0;
    done_.push_back(open_);
  }
  if (stage_ != Stage::kNone) return;
  open_ = RestartRecord{};
  open_.restart = restarts_ + 1;
  open_.failed = t;
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

void RestartClock::onStarted(double t, int warm, int cold) {
  if (stage_ != Stage::kFormed) return;
  open_.started = t;
  open_.warm = warm;
  open_.cold = cold;
  ++restarts_;
  stage_ = Stage::kStarted;
}

std::optional<RestartRecord> RestartClock::onSteps(double t, const std::vector<uint64_t>& steps,
                                                   double restore_seconds) {
  if (stage_ != Stage::kStarted || steps.empty()) return std::nullopt;
  if (std::any_of(steps.begin(), steps.end(), [](uint64_t s) { return s == 0; }))
    return std::nullopt;
  open_.first_step = t;
  open_.restore = restore_seconds;
  stage_ = Stage::kNone;
  done_.push_back(open_);
  return open_;
}

std::optional<RestartRecord> RestartClock::onGroupEnded() {
  if (stage_ != Stage::kStarted) return std::nullopt;
  stage_ = Stage::kNone;
  done_.push_back(open_);
  return open_;
}

std::string RestartClock::summary() const {
  std::string s;
  for (const auto& r : done_) s += fmt::format("\n  restart {}: {}", r.restart, r.describe());
  return s;
}

}  // namespace ddpl::launcher::warm
