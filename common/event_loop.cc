#include "common/event_loop.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>

namespace ddpl {

EventLoop::EventLoop() {
  epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
  wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (epoll_fd_ < 0 || wake_fd_ < 0 || !add(wake_fd_, EPOLLIN, kWakeTag)) error_ = errno;
}

EventLoop::~EventLoop() {
  if (epoll_fd_ >= 0) close(epoll_fd_);
  if (wake_fd_ >= 0) close(wake_fd_);
}

bool EventLoop::add(int fd, uint32_t events, uint64_t tag) {
  epoll_event ev{};
  ev.events = events;
  ev.data.u64 = tag;
  return epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev) == 0;
}

bool EventLoop::modify(int fd, uint32_t events, uint64_t tag) {
  epoll_event ev{};
  ev.events = events;
  ev.data.u64 = tag;
  return epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, fd, &ev) == 0;
}

void EventLoop::remove(int fd) { epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, fd, nullptr); }

void EventLoop::wake() {
  uint64_t one = 1;
  ssize_t n = write(wake_fd_, &one, sizeof(one));
  (void)n;  // a full counter already wakes the loop
}

void EventLoop::post(std::function<void()> fn) {
  {
    std::lock_guard<std::mutex> lock(posted_mu_);
    posted_.push_back(std::move(fn));
  }
  wake();
}

EventLoop::TimerId EventLoop::addTimer(Clock::time_point when, Clock::duration every,
                                       std::function<void()> fn) {
  TimerId id = next_timer_++;
  timers_.emplace(std::make_pair(when, id), Timer{every, std::move(fn)});
  deadline_of_[id] = when;
  return id;
}

bool EventLoop::cancelTimer(TimerId id) {
  auto it = deadline_of_.find(id);
  if (it == deadline_of_.end()) return false;
  timers_.erase(std::make_pair(it->second, id));
  deadline_of_.erase(it);
  return true;
}

int EventLoop::timeoutFor(int timeout_ms, Clock::time_point now) const {
  if (timers_.empty()) return timeout_ms;
  auto next = timers_.begin()->first.first;
  int64_t ms = next <= now ? 0 : std::chrono::ceil<std::chrono::milliseconds>(next - now).count();
  if (timeout_ms >= 0 && timeout_ms < ms) return timeout_ms;
  return static_cast<int>(std::min<int64_t>(ms, INT32_MAX));
}

void EventLoop::runPosted() {
  std::vector<std::function<void()>> batch;
  {
    std::lock_guard<std::mutex> lock(posted_mu_);
    batch.swap(posted_);
  }
  for (auto& fn : batch) fn();
}

void EventLoop::runDueTimers(Clock::time_point now) {
  // Only the timers due now: one added or re-armed by a callback for later waits its turn.
  while (!timers_.empty() && timers_.begin()->first.first <= now) {
    auto node = timers_.extract(timers_.begin());
    TimerId id = node.key().second;
    std::function<void()> fn;
    if (node.mapped().every > Clock::duration::zero()) {
      auto next = node.key().first + node.mapped().every;
      while (next <= now) next += node.mapped().every;
      fn = node.mapped().fn;
      node.key() = std::make_pair(next, id);
      deadline_of_[id] = next;
      timers_.insert(std::move(node));
    } else {
      fn = std::move(node.mapped().fn);
      deadline_of_.erase(id);
    }
    fn();
  }
}

int EventLoop::wait(epoll_event* events, int max_events, int timeout_ms) {
  int n = epoll_wait(epoll_fd_, events, max_events, timeoutFor(timeout_ms, Clock::now()));
  if (n < 0) {
    if (errno != EINTR) return -1;
    n = 0;
  }
  int kept = 0;
  bool woken = false;
  for (int i = 0; i < n; ++i) {
    if (events[i].data.u64 == kWakeTag) {
      woken = true;
      continue;
    }
    events[kept++] = events[i];
  }
  if (woken) {
    uint64_t v;
    while (read(wake_fd_, &v, sizeof(v)) > 0) {
    }
    runPosted();
  }
  runDueTimers(Clock::now());
  return kept;
}

}  // namespace ddpl
