// The end-of-run summary's figures and advice (launcher/health/progress.h), on injected times.
#include "launcher/health/progress.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
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
  t.onStep(0, 5, 103.0);                                         // no change: not a step
  t.onExit(0, 104.0, 2.0, 2048);
  t.onExit(1, 102.0, 0.1, 512);  // never beat
  ASSERT_TRUE(t.ranks()[0].meanStepSeconds().has_value());
  EXPECT_DOUBLE_EQ(*t.ranks()[0].meanStepSeconds(), 0.5);
  EXPECT_FALSE(t.ranks()[1].meanStepSeconds().has_value());
  std::string s = t.summary(110.0, 8, 1);
  EXPECT_EQ(row(s, 4),
            (std::vector<std::string>{"4", "0", "4.0s", "5", "500ms", "2.0s", "50%", "2MiB"}))
      << s;
  EXPECT_EQ(row(s, 5),
            (std::vector<std::string>{"5", "1", "2.0s", "-", "-", "100ms", "5%", "512KiB"}))
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
  EXPECT_EQ(h.limitFor(0), 0);    // no step yet: not watched
  h.observe(0, 1, 0, false, 10);  // the first step includes start-up: not a step time
  EXPECT_DOUBLE_EQ(h.limitFor(0), 3);
  h.observe(0, 2, 0, false, 10.5);  // 0.5 s steps
  EXPECT_DOUBLE_EQ(h.limitFor(0), 5);
  EXPECT_TRUE(h.check(15).empty());
  EXPECT_EQ(h.check(15.6).size(), 1u);
}

// Issue 44: a rank that reported its last step is tearing down: no step follows, and the hang
// timeout no longer applies to it; --hang-finish-timeout (or its stepping limit, if longer)
// bounds the teardown. A step after the report cancels it.
TEST(Hang, RankPastItsLastStepIsHeldToTheFinishTimeout) {
  HangOptions o;
  o.timeout_sec = 2;
  o.finish_timeout_sec = 10;
  HangDetector h(o);
  h.start(2, 0);
  h.observe(0, 5, 0, false, 1);
  h.onFinished(0, 1);
  h.observe(1, 5, 0, false, 1);
  EXPECT_TRUE(h.check(2.5).empty());
  auto stepping = h.check(3.1);  // rank 1 did not report its last step: hung
  ASSERT_EQ(stepping.size(), 1u);
  EXPECT_EQ(stepping[0].local_rank, 1);
  h.onFinished(0, 5);  // seen again: still finishing since t=1
  EXPECT_TRUE(h.check(10.9).empty());
  auto stuck = h.check(11.1);
  ASSERT_EQ(stuck.size(), 1u);
  EXPECT_EQ(stuck[0].local_rank, 0);
  EXPECT_DOUBLE_EQ(stuck[0].limit_sec, 10);
  EXPECT_NE(stuck[0].why.find("after reporting its last step, step 5 (limit 10.0s"),
            std::string::npos)
      << stuck[0].why;

  // A step after the report: stepping again, under the hang timeout.
  h.start(1, 20);
  h.observe(0, 3, 0, false, 20);
  h.onFinished(0, 20);
  h.observe(0, 4, 0, false, 21);
  EXPECT_TRUE(h.check(22.9).empty());
  EXPECT_EQ(h.check(23.1).size(), 1u);

  // Never less than the limit it had while stepping.
  HangOptions long_steps;
  long_steps.timeout_sec = 30;
  long_steps.finish_timeout_sec = 10;
  HangDetector l(long_steps);
  l.start(1, 0);
  l.observe(0, 1, 0, false, 1);
  l.onFinished(0, 1);
  EXPECT_TRUE(l.check(30.9).empty());
  EXPECT_EQ(l.check(31.1).size(), 1u);

  // Idle ranks without steps wait for a finishing one (a barrier in its teardown); they are
  // judged again once it has exited.
  HangOptions idle;
  idle.timeout_sec = 2;
  HangDetector w(idle);
  w.start(2, 0);
  for (int tick = 1; tick <= 60; ++tick) {
    double now = tick * 0.1;
    w.observe(0, 0, 1, false, now);  // idle from the start
    w.observe(1, 0, 1, false, now);
    w.onFinished(1, now);
    ASSERT_TRUE(w.check(now).empty()) << tick;
  }
  w.onExit(1);
  EXPECT_EQ(w.check(6.1).size(), 1u);
}

// What the stacks service waits on after a hang: no rule finds a new group hung sooner.
TEST(Hang, SoonestLimitIsTheSmallestRuleOrZeroWhenOff) {
  HangOptions o;
  EXPECT_DOUBLE_EQ(o.soonestLimitSec(), 600);  // the automatic floor
  o.first_step_timeout_sec = 90;
  EXPECT_DOUBLE_EQ(o.soonestLimitSec(), 90);
  o.timeout_sec = 5;
  EXPECT_DOUBLE_EQ(o.soonestLimitSec(), 5);
  o.timeout_sec = 0;  // --hang-timeout=0
  EXPECT_DOUBLE_EQ(o.soonestLimitSec(), 0);
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
  h.observe(0, 0, 1.5, false, 2);   // CPU time grew: progress
  h.observe(0, 0, 1.5, true, 3.5);  // output: progress
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

// Issue 33: idle Python ranks (asleep, or waiting in Gloo's all-reduce) still get a 10 ms CPU
// tick every few seconds (0.13-0.23% of a core measured here); that is not progress.
TEST(Hang, RanksWithoutStepsIdlingWithOccasionalTicksAreHung) {
  HangOptions o;
  o.timeout_sec = 15;
  HangDetector h(o);
  h.start(4, 0);
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> gap(0.2, 8);
  std::vector<double> cpu(4, 3.0), next_tick(4, 0);  // 3 s of start-up, then idle
  std::vector<Hang> hung;
  double found = 0;
  for (int tick = 1; tick <= 400 && hung.empty(); ++tick) {
    double now = tick * 0.1;
    for (int r = 0; r < 4; ++r) {
      if (now >= next_tick[r]) {
        cpu[r] += 0.01;
        next_tick[r] = now + gap(rng);
      }
      h.observe(r, 0, cpu[r], false, now);
    }
    hung = h.check(now);
    found = now;
  }
  ASSERT_EQ(hung.size(), 4u);  // every rank: none of them works
  EXPECT_GT(found, 15);
  EXPECT_LT(found, 15.5);
  EXPECT_NE(hung[0].why.find("no CPU time and no output for 15."), std::string::npos)
      << hung[0].why;
  EXPECT_NE(hung[0].why.find("idle rank's"), std::string::npos) << hung[0].why;
}

// A rank that computes is never hung, and while it computes, the idle ranks of its node (which
// wait for it in a collective) are not either; once it too idles, all are, a window later.
TEST(Hang, NoRankIsHungWhileOneOfTheNodeComputes) {
  HangOptions o;
  o.timeout_sec = 6;
  HangDetector h(o);
  h.start(3, 0);
  double busy = 0, ticks = 1;
  std::vector<Hang> hung;
  double found = 0;
  for (int tick = 1; tick <= 600 && hung.empty(); ++tick) {
    found = tick * 0.1;
    if (tick <= 400) busy += 0.05;  // rank 1: 50% of a core for 40 s
    if (tick % 50 == 0) ticks += 0.01;
    h.observe(0, 0, ticks, false, found);  // a tick every 5 s
    h.observe(1, 0, busy, false, found);
    h.observe(2, 0, 1.0, false, found);  // none
    hung = h.check(found);
  }
  EXPECT_EQ(hung.size(), 3u);
  EXPECT_GT(found, 45.5);  // 6 s after rank 1 stopped (less the 0.12 s of CPU a window allows)
  EXPECT_LT(found, 46.3);
  // Above the idle rate (3% of a core), or output now and then: work.
  HangDetector slow(o);
  slow.start(1, 0);
  for (int tick = 1; tick <= 300; ++tick) {
    slow.observe(0, 0, tick * 0.003, false, tick * 0.1);
    ASSERT_TRUE(slow.check(tick * 0.1).empty()) << tick;
  }
  HangDetector talks(o);
  talks.start(1, 0);
  for (int tick = 1; tick <= 300; ++tick) {
    talks.observe(0, 0, 1, tick % 50 == 0, tick * 0.1);
    ASSERT_TRUE(talks.check(tick * 0.1).empty()) << tick;
  }
  // A rank that exited does not keep the others waiting.
  HangDetector gone(o);
  gone.start(2, 0);
  for (int tick = 1; tick <= 70; ++tick) {
    gone.observe(0, 0, 1, false, tick * 0.1);
    if (tick < 5) gone.observe(1, 0, tick * 0.1, false, tick * 0.1);
    if (tick == 5) gone.onExit(1);
  }
  EXPECT_EQ(gone.check(7.0).size(), 1u);
  // A short limit: two or three ticks in it are still idle (the 50 ms floor).
  HangOptions short_limit;
  short_limit.timeout_sec = 1;
  HangDetector quick(short_limit);
  quick.start(1, 0);
  for (int tick = 1; tick <= 12; ++tick)
    quick.observe(0, 0, 1 + (tick > 3 ? 0.02 : 0), false, tick * 0.1);
  EXPECT_EQ(quick.check(1.2).size(), 1u);
}

TEST(Progress, StragglerByOwnTimePerStepInEachOfItsWindows) {
  StragglerOptions o;
  o.window_steps = 10;
  o.window_sec = 0.25;  // 5 steps at this pace: 10 steps make a window
  ProgressTracker t;
  t.start(3, 0, 0);
  // Lockstep: every rank steps every 50 ms; ranks 0 and 1 wait 40 ms of it for rank 2.
  for (int s = 1; s <= 40; ++s) {
    double now = s * 0.05;
    t.onStep(0, s, now, s * 40000);
    t.onStep(1, s, now, s * 40000);
    t.onStep(2, s, now, s * 2000);
    if (s <= 30) EXPECT_TRUE(t.newStragglers(o).empty()) << s;  // 3 windows of 10 steps
  }
  auto found = t.newStragglers(o);
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].local_rank, 2);
  EXPECT_NEAR(found[0].own_ms, 48, 0.5);
  EXPECT_NEAR(found[0].median_ms, 10, 0.5);
  EXPECT_EQ(found[0].steps, 30);
  EXPECT_EQ(found[0].windows, 3);
  EXPECT_TRUE(t.newStragglers(o).empty());  // reported once
  EXPECT_NE(t.summary(2, 8, 1).find("straggler: rank 2 (local rank 2) takes 48.0 ms of its own "
                                    "per step against the median rank's 10.0 ms (+380%) over its "
                                    "last 30 steps, slower in each of 3 windows of 10"),
            std::string::npos)
      << t.summary(2, 8, 1);

  // Without wait figures, even step times: nobody.
  ProgressTracker even;
  even.start(3, 0, 0);
  for (int s = 1; s <= 40; ++s)
    for (int r = 0; r < 3; ++r) even.onStep(r, s, s * 0.05);
  EXPECT_TRUE(even.newStragglers(o).empty());
}

// Issue 33: a rank slowed for a while (another process on its core) is slower in one window or
// two, not in every one: not a straggler. Nor is one with a few 3x outlier steps in each window:
// the median step does not move.
TEST(Progress, ABurstOrOutlierStepsAreNotAStraggler) {
  StragglerOptions o;
  o.window_steps = 20;
  o.window_sec = 0;
  ProgressTracker t;
  t.start(4, 0, 0);
  double now = 0;
  std::vector<uint64_t> waited(4, 0);
  for (int s = 1; s <= 200; ++s) {
    // 10 ms of own time each; rank 1 1.8x for steps 100-139 (two windows of 20), rank 3 3x on
    // every tenth step.
    std::vector<double> own(4, 0.010);
    if (s >= 100 && s < 140) own[1] *= 1.8;
    if (s % 10 == 0) own[3] *= 3;
    double slowest = *std::max_element(own.begin(), own.end());
    now += slowest;
    for (int r = 0; r < 4; ++r) {
      waited[r] += static_cast<uint64_t>((slowest - own[r]) * 1e6);
      t.onStep(r, s, now, waited[r]);
    }
    EXPECT_TRUE(t.newStragglers(o).empty()) << s;
  }
  for (int r = 0; r < 4; ++r) t.onExit(r, now, 1, 1024);
  EXPECT_TRUE(t.newStragglers(o).empty());
  // The same burst for 60 steps covers three windows: by then it is one.
  ProgressTracker slow;
  slow.start(4, 0, 0);
  now = 0;
  std::fill(waited.begin(), waited.end(), 0);
  int found_at = 0;
  for (int s = 1; s <= 200 && !found_at; ++s) {
    std::vector<double> own(4, 0.010);
    if (s >= 100) own[1] *= 1.8;
    double slowest = *std::max_element(own.begin(), own.end());
    now += slowest;
    for (int r = 0; r < 4; ++r) {
      waited[r] += static_cast<uint64_t>((slowest - own[r]) * 1e6);
      slow.onStep(r, s, now, waited[r]);
    }
    auto found = slow.newStragglers(o);
    if (!found.empty()) {
      EXPECT_EQ(found[0].local_rank, 1);
      found_at = s;
    }
  }
  EXPECT_EQ(found_at, 150);  // slower in most of its oldest window of 20 steps, and the rest
}

// A run too short for the windows is judged once every rank has exited, in three parts of the
// steps it made (the rank that finished first counts by its steps).
TEST(Progress, AShortRunIsJudgedOnItsStepsAtTheEnd) {
  ProgressTracker t;
  t.start(3, 0, 0);
  for (int s = 1; s <= 40; ++s)
    for (int r = 0; r < 3; ++r) t.onStep(r, s, s * (r == 1 ? 0.05 : 0.02));  // not lockstep
  EXPECT_TRUE(t.newStragglers().empty());  // 5 s windows: far too short while it runs
  t.onExit(0, 0.8, 1, 1024);
  t.onExit(2, 0.8, 1, 1024);
  EXPECT_TRUE(t.newStragglers().empty());  // rank 1 still runs
  t.onExit(1, 2.0, 1, 1024);
  auto found = t.newStragglers();
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].local_rank, 1);
  EXPECT_NEAR(found[0].own_ms, 50, 0.5);
  EXPECT_NEAR(found[0].median_ms, 20, 0.5);
  EXPECT_EQ(found[0].steps, 39);
  // Too few steps to judge at all: nobody.
  ProgressTracker tiny;
  tiny.start(2, 0, 0);
  for (int s = 1; s <= 10; ++s)
    for (int r = 0; r < 2; ++r) tiny.onStep(r, s, s * (r == 1 ? 0.05 : 0.02));
  tiny.onExit(0, 1, 1, 1024);
  tiny.onExit(1, 1, 1, 1024);
  EXPECT_TRUE(tiny.newStragglers().empty());
}

// Issue 44 (fuzz_heartbeat): the step is whatever 64-bit number a worker writes. Ranks that
// jumped by nearly 2^64 steps in a tenth of a second asked for a window of 9e20 steps, and its
// conversion to size_t was undefined (clang's -fsanitize=float-cast-overflow stops there; gcc's
// x86 code happened to give 0). The window is capped: nothing is named, nothing overflows.
TEST(Progress, HeartbeatsThatJumpByNearly2To64StepsAreJudgedWithoutOverflow) {
  ProgressTracker t;
  t.start(3, 0, 0);
  for (int r = 0; r < 3; ++r) {
    t.onStep(r, 1, 0.0, 0);
    t.onStep(r, UINT64_MAX - static_cast<uint64_t>(r), 0.1, UINT64_MAX);
  }
  EXPECT_TRUE(t.newStragglers().empty());
  for (int r = 0; r < 3; ++r) t.onExit(r, 0.2, 1, 1024);
  for (const auto& s : t.newStragglers()) EXPECT_GT(s.steps, 0) << s.describe();
  EXPECT_NE(t.summary(0.2, 2, 1).find("18446744073709551615"), std::string::npos);
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
  t.onExit(0, 10, 9.8, 1024);                  // 98% of one core
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

// Issue 33: balanced lockstep jobs on a shared machine, fed to the tracker as the agent feeds it
// (every rank read at each --monitor-interval tick, newStragglers() once a second and once more
// after the last exit). Seeded, so every run of the test sees the same 1000 jobs.
namespace {
struct SimJob {
  int nproc = 4;          // ranks this node's tracker sees
  int world = 4;          // ranks in the lockstep (a 2-node job: 2 of 4 seen here)
  double step_ms = 13.7;  // own time per step of an unhindered rank
  double seconds = 30;    // of stepping
  int slow_rank = -1;     // a real straggler: its own time times slow_factor
  double slow_factor = 1;
};

struct SimResult {
  std::vector<int> named;  // local ranks named as stragglers, live or at the end
  double first_named_at = -1;
};

// The noise of 4 ranks on a shared 2-core machine: each rank's own time per step varies by
// 8% or so (lognormal), is sometimes lengthened by a descheduling (heavy-tailed: 1 ms and
// up, Pareto, cut at 150 ms), now and then is 2-3x (an outlier step), and one rank at a time
// is slowed 1.2-1.8x for 0.3-3 s (another process on its core); ranks differ by up to +-3% for
// the whole run (15.5 vs 16.1 ms, as the whole-run figures). The collective ends when
// the last rank arrives; each rank reports the time it waited there (the heartbeat's second
// field) with its step. launch reads every 0.1 s, sometimes up to 50 ms late (it shares the
// cores).
SimResult simulate(const SimJob& job, std::mt19937_64& rng) {
  std::uniform_real_distribution<double> u(0, 1);
  std::normal_distribution<double> jitter(0, 0.08);
  ProgressTracker t;
  t.start(job.nproc, 0, 0);
  std::vector<double> bias(job.world);
  for (auto& b : bias) b = 0.97 + 0.06 * u(rng);
  // Interference bursts: one rank at a time, about one every 10 s.
  struct Burst {
    int rank;
    double from, to, factor;
  };
  std::vector<Burst> bursts;
  const double start = 1 + 2 * u(rng);  // start-up before the first step
  for (double at = start + -std::log(1 - u(rng)) * 10; at < start + job.seconds;
       at += -std::log(1 - u(rng)) * 10)
    bursts.push_back(
        {static_cast<int>(u(rng) * job.world), at, at + 0.3 + 2.7 * u(rng), 1.2 + 0.6 * u(rng)});
  auto own = [&](int r, double now) {
    double ms = job.step_ms * bias[r] * std::exp(jitter(rng));
    if (r == job.slow_rank) ms *= job.slow_factor;
    for (const auto& b : bursts)
      if (b.rank == r && now >= b.from && now < b.to) ms *= b.factor;
    if (u(rng) < 0.03) ms += std::min(150.0, 1.0 / std::pow(1 - u(rng), 1 / 1.2));
    if (u(rng) < 0.005) ms *= 2 + u(rng);
    return ms / 1000;
  };
  // Steps: when each becomes visible to launch, with each rank's total wait so far.
  struct Beat {
    double time;
    uint64_t step;
    uint64_t waited_us;
  };
  std::vector<std::vector<Beat>> beats(job.nproc);
  std::vector<double> waited(job.world, 0), arrive(job.world);
  double now = start;
  for (uint64_t step = 1; now < start + job.seconds; ++step) {
    double last = 0;
    for (int r = 0; r < job.world; ++r) last = std::max(last, arrive[r] = now + own(r, now));
    double end = last + 0.0002 + -std::log(1 - u(rng)) * 0.0001;
    for (int r = 0; r < job.world; ++r) waited[r] += end - arrive[r];
    for (int r = 0; r < job.nproc; ++r)
      beats[r].push_back({end + 0.0002 * u(rng), step, static_cast<uint64_t>(waited[r] * 1e6)});
    now = end;
  }
  SimResult res;
  auto note = [&](const std::vector<Straggler>& found, double at) {
    for (const auto& s : found) {
      res.named.push_back(s.local_rank);
      if (res.first_named_at < 0) res.first_named_at = at - start;
    }
  };
  std::vector<size_t> next(job.nproc, 0);
  double next_check = 0;
  for (double tick = 0.1; tick < now; tick += 0.1) {
    double read = tick + (u(rng) < 0.05 ? 0.05 * u(rng) : 0);
    for (int r = 0; r < job.nproc; ++r) {
      while (next[r] + 1 < beats[r].size() && beats[r][next[r] + 1].time <= read) ++next[r];
      const Beat& b = beats[r][next[r]];
      if (b.time <= read) t.onStep(r, b.step, read, b.waited_us);
    }
    if (read >= next_check) {
      next_check = read + 1;
      note(t.newStragglers(), read);
    }
  }
  for (int r = 0; r < job.nproc; ++r) {
    double exit_time = now + 0.05 * u(rng);
    t.onStep(r, beats[r].back().step, exit_time, beats[r].back().waited_us);
    t.onExit(r, exit_time, 1, 1024);
  }
  note(t.newStragglers(), now + 0.05);
  return res;
}

// The shapes of job the issue ran, and more: 4 ranks at the 13.7 ms, slower steps,
// 2 ranks of a 2-node job (the lower median is then the faster rank), 8 ranks.
SimJob shape(int i) {
  SimJob j;
  switch (i % 5) {
    case 0:
      break;
    case 1:
      j.step_ms = 50;
      break;
    case 2:
      j.nproc = 2;
      break;
    case 3:
      j.nproc = j.world = 8;
      j.step_ms = 30;
      break;
    case 4:
      j.step_ms = 200;
      j.seconds = 60;
      break;
  }
  return j;
}
}  // namespace

// Judged over one 20-step window (before issue 33), 895 of these 1000 jobs named a straggler.
// With the defaults (3 windows of 5 s, mean and median) none does, still none at a 10% ratio
// (21 at 5%, where the ranks' own +-3% differ for real); with windows of 2 s, 5 do; with two
// windows of 5 s, 2; by the mean alone at 10%, 28.
TEST(Progress, NoStragglerInAThousandBalancedJobsWithNoise) {
  std::mt19937_64 rng(33);
  int false_positives = 0, by_shape[5] = {};
  std::vector<std::string> examples;
  for (int i = 0; i < 1000; ++i) {
    SimResult r = simulate(shape(i), rng);
    if (r.named.empty()) continue;
    ++false_positives;
    ++by_shape[i % 5];
    if (examples.size() < 5)
      examples.push_back("job " + std::to_string(i) + " (shape " + std::to_string(i % 5) +
                         "): rank " + std::to_string(r.named[0]) + " at " +
                         std::to_string(r.first_named_at) + " s");
  }
  std::printf(
      "balanced jobs with a straggler named: %d of 1000 (of 200 per shape: %d %d %d %d %d)\n",
      false_positives, by_shape[0], by_shape[1], by_shape[2], by_shape[3], by_shape[4]);
  for (const auto& e : examples) std::printf("  %s\n", e.c_str());
  EXPECT_EQ(false_positives, 0);
}

TEST(Progress, RealStragglersAreStillFoundThroughTheNoise) {
  std::mt19937_64 rng(34);
  for (double factor : {3.0, 1.5}) {
    int found = 0, wrong = 0;
    std::vector<double> when;
    for (int i = 0; i < 200; ++i) {
      SimJob j = shape(i);
      j.slow_rank = static_cast<int>(i / 5 % j.nproc);
      j.slow_factor = factor;
      SimResult r = simulate(j, rng);
      bool named = std::find(r.named.begin(), r.named.end(), j.slow_rank) != r.named.end();
      found += named;
      wrong += static_cast<int>(r.named.size()) - named;
      if (static_cast<int>(r.named.size()) > named)
        std::printf("  job %d (shape %d, rank %d slower): rank %d named too at %.1f s\n", i, i % 5,
                    j.slow_rank, r.named.back(), r.first_named_at);
      if (named) when.push_back(r.first_named_at);
    }
    std::sort(when.begin(), when.end());
    std::printf(
        "%.1fx slower rank: found in %d of 200 jobs (median %.1fs after the first step), "
        "another rank named in %d\n",
        factor, found, when.empty() ? -1.0 : when[when.size() / 2], wrong);
    EXPECT_EQ(found, 200) << factor;
    EXPECT_EQ(wrong, 0) << factor;
  }
}
