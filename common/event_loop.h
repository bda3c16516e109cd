#pragma once
// One thread's event loop: an epoll set whose descriptors carry the owner's 64-bit tags, an
// eventfd that any thread writes to wake it (with closures posted to run on the loop's thread),
// and timers on the steady clock. The agent, the rendezvous server's connection gate and its
// store socket each run one; before this there were three hand-written copies.
//
// Threads: post(), wake() and the descriptor calls (add, modify, remove: epoll_ctl) from any
// thread; timers and wait() on the loop's thread (or before it starts). Timers and posted
// closures run inside wait(), on the loop's thread, never while another of its handlers runs.
#include <sys/epoll.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <utility>
#include <vector>

namespace ddpl {

class EventLoop {
 public:
  using Clock = std::chrono::steady_clock;
  using TimerId = uint64_t;
  // Reserved for the loop's own eventfd: no descriptor of the owner may use it.
  static constexpr uint64_t kWakeTag = ~uint64_t{0};

  // Check error(): the kernel may refuse an epoll set or an eventfd (descriptor limits).
  EventLoop();
  ~EventLoop();
  EventLoop(const EventLoop&) = delete;
  EventLoop& operator=(const EventLoop&) = delete;

  // The errno that made construction fail, 0 when the loop is usable.
  int error() const { return error_; }

  // epoll_ctl on the loop's set: false (errno set) when the kernel refuses.
  bool add(int fd, uint32_t events, uint64_t tag);
  bool modify(int fd, uint32_t events, uint64_t tag);
  void remove(int fd);

  // Makes the current or next wait() return: one write(2), from any thread.
  void wake();
  // Runs `fn` on the loop's thread in the next wait(), in the order posted.
  void post(std::function<void()> fn);

  // Runs `fn` at `when`, then (when `every` is positive) every `every` after it, missed periods
  // skipped as a timerfd coalesces them. Due timers run in deadline order, ties in the order
  // they were added.
  TimerId addTimer(Clock::time_point when, Clock::duration every, std::function<void()> fn);
  TimerId addTimer(Clock::time_point when, std::function<void()> fn) {
    return addTimer(when, Clock::duration::zero(), std::move(fn));
  }
  // False when it had already fired (one-shot) or was cancelled; callable from a timer.
  bool cancelTimer(TimerId id);

  // Waits until a descriptor is ready, the loop is woken, the earliest timer is due, or
  // `timeout_ms` passes (-1: no limit of the caller's); then runs what was posted and the timers
  // that are due, and returns how many of `events` (at most `max_events`) are the owner's ready
  // descriptors (the eventfd drained, not among them). 0 after EINTR; -1 (errno set) when
  // epoll_wait fails otherwise.
  int wait(epoll_event* events, int max_events, int timeout_ms);

 private:
  int timeoutFor(int timeout_ms, Clock::time_point now) const;
  void runPosted();
  void runDueTimers(Clock::time_point now);

  int epoll_fd_ = -1;
  int wake_fd_ = -1;
  int error_ = 0;
  struct Timer {
    Clock::duration every;
    std::function<void()> fn;
  };
  // By (deadline, id): the first entry is due first; equal deadlines in the order added.
  std::map<std::pair<Clock::time_point, TimerId>, Timer> timers_;
  std::map<TimerId, Clock::time_point> deadline_of_;
  TimerId next_timer_ = 1;
  std::mutex posted_mu_;
  std::vector<std::function<void()>> posted_;
};

}  // namespace ddpl
