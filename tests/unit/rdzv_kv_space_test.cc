// KvSpace (the server's parked waiters) and TimerQueue, without gRPC.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <future>
#include <thread>

#include "common/errors.h"
#include "rendezvous/state/timer_queue.h"
#include "rendezvous/store/kv_space.h"

namespace ddpl::rdzv {
namespace {

TEST(KvSpaceTest, WaiterFiresOnceWhenTheLastKeyArrives) {
  KvSpace kv;
  kv.set("a", toBytes("1"));
  int fired = 0;
  std::vector<Bytes> got;
  auto start = kv.waitFor({"a", "b", "c"}, true, [&](std::vector<Bytes> v) {
    ++fired;
    got = std::move(v);
  });
  ASSERT_FALSE(start.ready);
  EXPECT_EQ(kv.parkedCount(), 1u);
  kv.set("b", toBytes("2"));
  EXPECT_EQ(fired, 0);
  kv.multiSet({"c", "b"}, {toBytes("3"), toBytes("22")});
  EXPECT_EQ(fired, 1);
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(toString(got[1]), "22");
  kv.set("c", toBytes("4"));
  EXPECT_EQ(fired, 1);
  EXPECT_EQ(kv.parkedCount(), 0u);
}

TEST(KvSpaceTest, KeyDeletedWhileWaitingMustArriveAgain) {
  KvSpace kv;
  kv.set("a", toBytes("1"));
  bool fired = false;
  kv.waitFor({"a", "b"}, false, [&](std::vector<Bytes>) { fired = true; });
  kv.deleteKey("a");
  kv.set("b", toBytes("2"));
  EXPECT_FALSE(fired);
  kv.add("a", 1);
  EXPECT_TRUE(fired);
}

TEST(KvSpaceTest, ReadyKeysAnswerAtOnceAndCancelBeatsLateArrival) {
  KvSpace kv;
  kv.set("a", toBytes("x"));
  auto s = kv.waitFor({"a"}, true, [](std::vector<Bytes>) { FAIL(); });
  ASSERT_TRUE(s.ready);
  EXPECT_EQ(toString(s.values.at(0)), "x");
  bool fired = false;
  auto p = kv.waitFor({"b"}, false, [&](std::vector<Bytes>) { fired = true; });
  EXPECT_TRUE(kv.cancelWait(p.id));
  EXPECT_FALSE(kv.cancelWait(p.id));
  kv.set("b", {});
  EXPECT_FALSE(fired);
}

TEST(KvSpaceTest, CountersCompareSetAndPrefixCounts) {
  KvSpace kv;
  EXPECT_EQ(kv.add("run1/n", 5), 5);
  EXPECT_EQ(kv.add("run1/n", -2), 3);
  kv.set("run1/s", toBytes("text"));
  EXPECT_THROW(kv.add("run1/s", 1), StoreError);
  kv.set("run2/x", {});
  EXPECT_EQ(kv.numKeys(""), 3);
  EXPECT_EQ(kv.numKeys("run1/"), 2);
  EXPECT_EQ(kv.numKeys("run3/"), 0);
  EXPECT_EQ(toString(kv.compareSet("c", toBytes("nope"), toBytes("v"))), "nope");
  EXPECT_FALSE(kv.check({"c"}));
  EXPECT_EQ(toString(kv.compareSet("c", {}, toBytes("v"))), "v");
  EXPECT_EQ(toString(kv.compareSet("c", toBytes("w"), toBytes("z"))), "v");
  EXPECT_EQ(toString(kv.compareSet("c", toBytes("v"), toBytes("z"))), "z");
}

TEST(TimerQueueTest, RunsInDeadlineOrderAndCancelPreventsRun) {
  TimerQueue tq;
  std::mutex mu;
  std::vector<int> order;
  std::promise<void> done;
  auto now = Clock::now();
  tq.schedule(now + std::chrono::milliseconds(60), [&] {
    std::lock_guard<std::mutex> l(mu);
    order.push_back(3);
    done.set_value();
  });
  auto cancelled = tq.schedule(now + std::chrono::milliseconds(30), [&] {
    std::lock_guard<std::mutex> l(mu);
    order.push_back(99);
  });
  tq.schedule(now + std::chrono::milliseconds(10), [&] {
    std::lock_guard<std::mutex> l(mu);
    order.push_back(1);
  });
  EXPECT_TRUE(tq.cancel(cancelled));
  ASSERT_EQ(done.get_future().wait_for(std::chrono::seconds(10)), std::future_status::ready);
  std::lock_guard<std::mutex> l(mu);
  EXPECT_EQ(order, (std::vector<int>{1, 3}));
  EXPECT_GE(Clock::now(), now + std::chrono::milliseconds(60));
}

}  // namespace
}  // namespace ddpl::rdzv

namespace ddpl::rdzv {
namespace {

// The timer thread waits until its earliest deadline; cancelling that very timer meanwhile freed
// the deadline it was waiting on (a use-after-free under ASan, `make test-asan`).
TEST(TimerQueueTest, CancellingTheTimerTheThreadWaitsForIsSafe) {
  TimerQueue q;
  std::atomic<int> ran{0};
  for (int i = 0; i < 200; ++i) {
    auto id = q.schedule(Clock::now() + std::chrono::hours(1), [&] { ++ran; });
    std::this_thread::sleep_for(std::chrono::microseconds(200));  // the thread is waiting on it
    EXPECT_TRUE(q.cancel(id));
  }
  q.schedule(Clock::now(), [&] { ++ran; });
  auto deadline = Clock::now() + std::chrono::seconds(10);
  while (ran.load() == 0 && Clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_EQ(ran.load(), 1);
}

TEST(KvSpaceTest, DeletePrefixRemovesOnlyThatRunsKeys) {
  KvSpace kv;
  for (auto k : {"job1/0/a", "job1/1/b", "job10/0/a", "job2/0/a", "job1"}) kv.set(k, toBytes("x"));
  EXPECT_EQ(kv.deletePrefix("job1/"), 2);
  EXPECT_EQ(kv.numKeys(""), 3);
  EXPECT_TRUE(kv.check({"job10/0/a", "job2/0/a", "job1"}));
  EXPECT_THROW(kv.deletePrefix(""), InvalidArgument);
}

// torch's LIST_KEYS: the keys under a prefix, without it; queues are not keys; past the byte
// bound no keys, but the whole counted.
TEST(KvSpaceTest, ListKeysUnderAPrefixWithinABound) {
  KvSpace kv;
  for (auto k : {"ns/1/a", "ns/1/bc", "ns/1/", "ns/10/x", "ns/2/a"}) kv.set(k, toBytes("x"));
  kv.queuePush("ns/1/q", toBytes("item"));
  auto all = kv.listKeys("ns/1/", 1000, 8);
  EXPECT_TRUE(all.complete);
  EXPECT_EQ(all.keys, (std::vector<std::string>{"", "a", "bc"}));
  EXPECT_EQ(all.count, 3);
  EXPECT_EQ(all.bytes, 3u * 8 + 0 + 1 + 2);
  auto exact = kv.listKeys("ns/1/", 27, 8);
  EXPECT_TRUE(exact.complete) << "exactly the bound";
  EXPECT_EQ(exact.keys.size(), 3u);
  auto over = kv.listKeys("ns/1/", 26, 8);
  EXPECT_FALSE(over.complete);
  EXPECT_TRUE(over.keys.empty());
  EXPECT_EQ(over.count, 3);
  EXPECT_EQ(over.bytes, 27u);
  EXPECT_EQ(kv.listKeys("none/", 1000, 8).count, 0);
}

}  // namespace
}  // namespace ddpl::rdzv
