#include "rendezvous/state/timer_queue.h"

namespace ddpl::rdzv {

TimerQueue::TimerQueue() : thread_([this] { loop(); }) {}

TimerQueue::~TimerQueue() { stop(); }

void TimerQueue::stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id()) thread_.join();
}

TimerQueue::TimerId TimerQueue::schedule(Clock::time_point when, std::function<void()> fn) {
  bool earliest;
  TimerId id;
  {
    std::lock_guard<std::mutex> lock(mu_);
    id = next_id_++;
    auto it = queue_.emplace(when, std::make_pair(id, std::move(fn)));
    by_id_.emplace(id, it);
    earliest = it == queue_.begin();
  }
  if (earliest) cv_.notify_one();
  return id;
}

bool TimerQueue::cancel(TimerId id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = by_id_.find(id);
  if (it == by_id_.end()) return false;
  queue_.erase(it->second);
  by_id_.erase(it);
  return true;
}

void TimerQueue::loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_) {
    if (queue_.empty()) {
      cv_.wait(lock);
      continue;
    }
    auto first = queue_.begin();
    if (first->first > Clock::now()) {
      // A copy: wait_until reads its deadline again after waking, and cancel() may have freed
      // the node it would otherwise refer to (a use-after-free ASan found).
      Clock::time_point when = first->first;
      cv_.wait_until(lock, when);
      continue;
    }
    auto fn = std::move(first->second.second);
    by_id_.erase(first->second.first);
    queue_.erase(first);
    lock.unlock();
    fn();
    lock.lock();
  }
}

}  // namespace ddpl::rdzv
