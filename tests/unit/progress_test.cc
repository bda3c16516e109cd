// The end-of-run summary's figures and advice (launcher/progress.h), on injected times.
#include "launcher/progress.h"

#include <gtest/gtest.h>

#include <sstream>

using namespace ddpl::launcher;

namespace {
// The row of `global_rank` split into its words.
std::vector<std::string> row(const std::string& summary, int global_rank) {
  std::istringstream in(summary);
  for (std::string line; std::getline(in, line);) {
    std::istringstream words(line);
    std::vector<std::string> w;
    for (std::string x; words >> x;) w.push_back(x);
    if (!w.empty() && w[0] == std::to_string(global_rank)) return w;
  }
  return {};
}
}  // namespace

TEST(Progress, StepsMeanStepCpuAndMemoryPerRank) {
  ProgressTracker t;
  t.start(2, 4, 100.0);
  for (int s = 1; s <= 5; ++s) t.onStep(0, s, 100.0 + s * 0.5);  // 0.5 s a step
  t.onStep(0, 5, 103.0);  // no change: not a step
  t.onExit(0, 104.0, 2.0, 2048);
  t.onExit(1, 102.0, 0.1, 512);  // never beat
  ASSERT_TRUE(t.ranks()[0].meanStepSeconds().has_value());
  EXPECT_DOUBLE_EQ(*t.ranks()[0].meanStepSeconds(), 0.5);
  EXPECT_FALSE(t.ranks()[1].meanStepSeconds().has_value());
  std::string s = t.summary(110.0, 8, 1);
  EXPECT_EQ(row(s, 4), (std::vector<std::string>{"4", "0", "4.0s", "5", "500ms", "2.0s", "50%", "2MiB"}))
      << s;
  EXPECT_EQ(row(s, 5), (std::vector<std::string>{"5", "1", "2.0s", "-", "-", "100ms", "5%", "512KiB"}))
      << s;
  EXPECT_EQ(s.find("advice"), std::string::npos) << s;
}

TEST(Progress, AdviceOnOversubscribedThreadsAndOneRanksMemory) {
  ProgressTracker t;
  t.start(4, 0, 0);
  for (int r = 0; r < 4; ++r) t.onExit(r, 10, 1, r == 3 ? 4 << 20 : 300 << 10);
  std::string s = t.summary(10, 4, 2);
  EXPECT_NE(s.find("advice: 4 ranks x OMP_NUM_THREADS=2 is 8 threads on 4 cores"),
            std::string::npos)
      << s;
  EXPECT_NE(s.find("lower OMP_NUM_THREADS to 1"), std::string::npos) << s;
  EXPECT_NE(s.find("advice: rank 3 peaked at 4.0GiB, more than twice the median rank's 300MiB"),
            std::string::npos)
      << s;
  // One thread per rank cannot be lowered; nobody's memory stands out.
  ProgressTracker even;
  even.start(4, 0, 0);
  for (int r = 0; r < 4; ++r) even.onExit(r, 10, 1, 300 << 10);
  EXPECT_EQ(even.summary(10, 2, 1).find("advice"), std::string::npos);
}

TEST(Hang, SteppingRanksAgainstAnExplicitLimit) {
  HangOptions o;
  o.timeout_sec = 5;
  HangDetector h(o);
  h.start(2, 0);
  h.observe(0, 1, 0, false, 1);
  h.observe(1, 1, 0, false, 1);
  h.observe(0, 2, 0, false, 2);
  EXPECT_TRUE(h.check(5.9).empty());
  auto first = h.check(6.1);  // rank 1: 5.1 s since its step
  ASSERT_EQ(first.size(), 1u);
  EXPECT_EQ(first[0].local_rank, 1);
  EXPECT_TRUE(h.check(6.2).empty());  // reported once
  auto second = h.check(7.1);
  ASSERT_EQ(second.size(), 1u);
  EXPECT_EQ(second[0].local_rank, 0);
  EXPECT_NE(second[0].why.find("after step 2"), std::string::npos) << second[0].why;
  h.onExit(0);
  h.start(2, 10);  // a new attempt watches afresh
  EXPECT_TRUE(h.check(14).empty());
}

TEST(Hang, AutomaticLimitIsTenSlowestStepsAboveTheFloor) {
  HangOptions o;
  o.auto_floor_sec = 3;
  HangDetector h(o);
  h.start(1, 0);
  EXPECT_EQ(h.limitFor(0), 0);  // no step yet: not watched
  h.observe(0, 1, 0, false, 10);  // the first step includes start-up: not a step time
  EXPECT_DOUBLE_EQ(h.limitFor(0), 3);
  h.observe(0, 2, 0, false, 10.5);  // 0.5 s steps
  EXPECT_DOUBLE_EQ(h.limitFor(0), 5);
  EXPECT_TRUE(h.check(15).empty());
  EXPECT_EQ(h.check(15.6).size(), 1u);
}

TEST(Hang, RanksWithoutStepsOnlyWithTheFlagOrWhenOthersStep) {
  HangDetector unwatched(HangOptions{});
  unwatched.start(1, 0);
  unwatched.observe(0, 0, 0, false, 1);
  EXPECT_TRUE(unwatched.check(1e6).empty());

  HangOptions o;
  o.timeout_sec = 2;
  HangDetector h(o);
  h.start(1, 0);
  h.observe(0, 0, 1.0, false, 1);
  h.observe(0, 0, 1.5, false, 2);    // CPU time grew: progress
  h.observe(0, 0, 1.5, true, 3.5);   // output: progress
  EXPECT_TRUE(h.check(5).empty());
  auto hung = h.check(5.6);
  ASSERT_EQ(hung.size(), 1u);
  EXPECT_NE(hung[0].why.find("no CPU time and no output"), std::string::npos);

  HangOptions first;
  first.first_step_timeout_sec = 10;
  HangDetector f(first);
  f.start(2, 0);
  f.observe(0, 1, 0, false, 1);
  EXPECT_TRUE(f.check(9).empty());
  auto late = f.check(11);
  ASSERT_EQ(late.size(), 1u);
  EXPECT_EQ(late[0].local_rank, 1);
  EXPECT_NE(late[0].why.find("no first step"), std::string::npos);
}

TEST(Progress, StragglerByOwnTimePerStepOverTheWindow) {
  ProgressTracker t;
  t.start(3, 0, 0);
  // Lockstep: every rank steps every 50 ms; ranks 0 and 1 wait 40 ms of it for rank 2.
  for (int s = 1; s <= 30; ++s) {
    double now = s * 0.05;
    t.onStep(0, s, now, s * 40000);
    t.onStep(1, s, now, s * 40000);
    t.onStep(2, s, now, s * 2000);
    if (s < 20) EXPECT_TRUE(t.newStragglers(1.2, 20).empty());  // not a full window yet
  }
  auto found = t.newStragglers(1.2, 20);
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].local_rank, 2);
  EXPECT_NEAR(found[0].own_ms, 48, 0.5);
  EXPECT_NEAR(found[0].median_ms, 10, 0.5);
  EXPECT_TRUE(t.newStragglers(1.2, 20).empty());  // reported once
  EXPECT_NE(t.summary(2, 8, 1).find("straggler: rank 2 (local rank 2)"), std::string::npos);

  // Without wait figures, even step times: nobody.
  ProgressTracker even;
  even.start(3, 0, 0);
  for (int s = 1; s <= 30; ++s)
    for (int r = 0; r < 3; ++r) even.onStep(r, s, s * 0.05);
  EXPECT_TRUE(even.newStragglers(1.2, 20).empty());
}

// With GPU figures, the summary shows each rank's mean GPU% and peak GPU memory, and advises on
// a GPU left waiting by a rank whose CPU is saturated (the input pipeline).
TEST(Progress, GpuColumnsAndTheInputPipelineAdvice) {
  ProgressTracker t;
  t.start(2, 0, 0);
  for (int i = 0; i < 4; ++i) {
    t.onGpu(0, 20.0 + i, int64_t{3} << 30);  // mean 21.5%
    t.onGpu(1, 90.0, int64_t{2} << 30);
  }
  t.onGpu(1, std::nullopt, int64_t{5} << 30);  // peak, no utilisation known
  t.onExit(0, 10, 9.8, 1024);                    // 98% of one core
  t.onExit(1, 10, 9.8, 1024);
  std::string s = t.summary(10, 8, 1);
  auto r0 = row(s, 0), r1 = row(s, 1);
  ASSERT_EQ(r0.size(), 10u) << s;
  EXPECT_EQ(r0[8], "22%") << s;
  EXPECT_EQ(r0[9], "3.0GiB") << s;
  EXPECT_EQ(r1[8], "90%") << s;
  EXPECT_EQ(r1[9], "5.0GiB") << s;
  EXPECT_NE(s.find("advice: rank 0's GPU was busy 22% of the time while its process used 98% "
                   "CPU: the input pipeline is the bottleneck"),
            std::string::npos)
      << s;
  EXPECT_EQ(s.find("rank 1's GPU"), std::string::npos) << s;
  // Without GPU figures the columns are not there.
  ProgressTracker cpu;
  cpu.start(1, 0, 0);
  cpu.onExit(0, 10, 1, 1024);
  EXPECT_EQ(row(cpu.summary(10, 8, 1), 0).size(), 8u);
}
