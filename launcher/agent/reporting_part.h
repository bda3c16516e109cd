#pragma once
// A part of launch that only reports (the live view, the dashboard, the metrics endpoint, the
// end-of-run summary, the steps after the start such as the manifest): what it shows is never
// worth the job. Each of its entry points from the agent runs through contain(): an exception
// inside is caught there, the first one logged as a warning naming the part, later ones at
// debug level (a part called twice a second would otherwise fill the log), and the job goes
// on, its exit code untouched. The part is called again next time: what failed on one line of
// a worker's output may work on the next.
//
// Threads: any (the count is atomic); the dashboard's server threads use its part too.
#include <atomic>
#include <exception>
#include <utility>

#include "common/log.h"

namespace ddpl::launcher {

class ReportingPart {
 public:
  // `name` says what stops showing: "the dashboard", "the end-of-run summary".
  explicit ReportingPart(const char* name) : name_(name) {}
  ReportingPart(const ReportingPart&) = delete;
  ReportingPart& operator=(const ReportingPart&) = delete;

  template <typename F>
  void contain(F&& f) noexcept {
    try {
      std::forward<F>(f)();
    } catch (const std::exception& e) {
      failed(e.what());
    } catch (...) {
      failed("an exception of no known type");
    }
  }

  // `f`'s result, or `fallback` when it throws.
  template <typename T, typename F>
  T contain(F&& f, T fallback) noexcept {
    try {
      return std::forward<F>(f)();
    } catch (const std::exception& e) {
      failed(e.what());
    } catch (...) {
      failed("an exception of no known type");
    }
    return fallback;
  }

  // How many calls failed so far.
  int failures() const { return failures_.load(); }

 private:
  void failed(const char* what) noexcept {
    if (failures_.fetch_add(1) == 0)
      log::warn("{} failed: {}; the job goes on (its later failures are logged at debug level)",
                name_, what);
    else
      log::debug("{} failed again: {}", name_, what);
  }

  const char* name_;
  std::atomic<int> failures_{0};
};

}  // namespace ddpl::launcher
