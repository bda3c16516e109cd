#include "common/event_loop.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

namespace ddpl {
namespace {

using Clock = EventLoop::Clock;
using std::chrono::milliseconds;

TEST(EventLoop, TimersFireInDeadlineOrderTiesInTheOrderAdded) {
  EventLoop loop;
  ASSERT_EQ(loop.error(), 0);
  std::vector<int> fired;
  auto t0 = Clock::now() + milliseconds(20);
  loop.addTimer(t0 + milliseconds(20), [&] { fired.push_back(3); });
  loop.addTimer(t0, [&] { fired.push_back(1); });
  loop.addTimer(t0, [&] { fired.push_back(2); });
  epoll_event ev[4];
  auto deadline = Clock::now() + std::chrono::seconds(5);
  while (fired.size() < 3 && Clock::now() < deadline) ASSERT_GE(loop.wait(ev, 4, -1), 0);
  EXPECT_EQ(fired, (std::vector<int>{1, 2, 3}));
  EXPECT_GE(Clock::now(), t0 + milliseconds(20));
}

TEST(EventLoop, AWaitWithoutATimerOrEventWaitsForItsTimeout) {
  EventLoop loop;
  epoll_event ev[1];
  auto start = Clock::now();
  EXPECT_EQ(loop.wait(ev, 1, 50), 0);
  EXPECT_GE(Clock::now() - start, milliseconds(45));
}

TEST(EventLoop, PeriodicTimerRepeatsUntilCancelledAndCancelledOnesNeverRun) {
  EventLoop loop;
  int ticks = 0, cancelled = 0;
  EventLoop::TimerId periodic = 0;
  periodic = loop.addTimer(Clock::now() + milliseconds(5), milliseconds(5), [&] {
    if (++ticks == 3) EXPECT_TRUE(loop.cancelTimer(periodic));
  });
  auto doomed = loop.addTimer(Clock::now() + milliseconds(10), [&] { ++cancelled; });
  EXPECT_TRUE(loop.cancelTimer(doomed));
  EXPECT_FALSE(loop.cancelTimer(doomed));
  epoll_event ev[1];
  auto end = Clock::now() + milliseconds(100);
  while (Clock::now() < end) loop.wait(ev, 1, 10);
  EXPECT_EQ(ticks, 3);
  EXPECT_EQ(cancelled, 0);
  EXPECT_FALSE(loop.cancelTimer(periodic));
}

TEST(EventLoop, WakeAndPostFromAnotherThreadEndAnUnboundedWait) {
  EventLoop loop;
  std::atomic<bool> ran{false};
  std::thread other([&] {
    std::this_thread::sleep_for(milliseconds(50));
    loop.post([&] { ran = true; });
  });
  epoll_event ev[1];
  auto start = Clock::now();
  // No timer and no limit: only the post can end this wait.
  EXPECT_EQ(loop.wait(ev, 1, -1), 0);
  other.join();
  EXPECT_TRUE(ran);
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(5));
  // The wake was drained: the next wait times out instead of returning at once.
  start = Clock::now();
  EXPECT_EQ(loop.wait(ev, 1, 30), 0);
  EXPECT_GE(Clock::now() - start, milliseconds(25));
}

TEST(EventLoop, ReadyDescriptorsComeBackWithTheirTagsUntilRemoved) {
  EventLoop loop;
  int p[2];
  ASSERT_EQ(pipe(p), 0);
  ASSERT_TRUE(loop.add(p[0], EPOLLIN, 42));
  ASSERT_EQ(write(p[1], "x", 1), 1);
  loop.wake();  // the eventfd is not among what wait returns
  epoll_event ev[4];
  ASSERT_EQ(loop.wait(ev, 4, 1000), 1);
  EXPECT_EQ(ev[0].data.u64, 42u);
  ASSERT_TRUE(loop.modify(p[0], EPOLLIN, 43));
  ASSERT_EQ(loop.wait(ev, 4, 1000), 1);
  EXPECT_EQ(ev[0].data.u64, 43u);
  loop.remove(p[0]);
  EXPECT_EQ(loop.wait(ev, 4, 20), 0);
  close(p[0]);
  close(p[1]);
}

}  // namespace
}  // namespace ddpl
