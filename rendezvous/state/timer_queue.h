#pragma once
// One thread that runs callbacks at given times: the server's parked calls and the
// rendezvous state machine's timeouts all hang off it, so nothing in the server sleeps in a
// loop waiting for a condition. The thread blocks until the earliest deadline or until a new,
// earlier one is scheduled.
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "rendezvous/store/store.h"

namespace ddpl::rdzv {

class TimerQueue {
 public:
  using TimerId = uint64_t;

  TimerQueue();
  ~TimerQueue();  // stops the thread; callbacks not yet due never run
  TimerQueue(const TimerQueue&) = delete;
  TimerQueue& operator=(const TimerQueue&) = delete;

  // Runs `fn` on the timer thread at `when` (at once when `when` is past).
  TimerId schedule(Clock::time_point when, std::function<void()> fn);

  // Returns whether the callback was still pending (it will then never run).
  bool cancel(TimerId id);

  void stop();

 private:
  void loop();

  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  TimerId next_id_ = 1;
  std::multimap<Clock::time_point, std::pair<TimerId, std::function<void()>>> queue_;
  std::unordered_map<TimerId, decltype(queue_)::iterator> by_id_;
  std::thread thread_;
};

}  // namespace ddpl::rdzv
