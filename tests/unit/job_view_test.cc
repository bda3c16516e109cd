// The live view's figures and lines (launcher/health/job_view.h), on injected samples and times.
#include "launcher/health/job_view.h"

#include <gtest/gtest.h>

#include "common/bytes.h"

using namespace ddpl::launcher;
using ddpl::humanBytes;

namespace {
RankUsage rank(int lr, uint64_t step, double cpu, int64_t rss) {
  RankUsage u;
  u.local_rank = lr;
  u.global_rank = 4 + lr;  // node 1 of a 2x4 job
  u.step = step;
  u.cpu_seconds = cpu;
  u.rss_bytes = rss;
  return u;
}
}  // namespace

TEST(JobView, RatesOverTheWindowAndTheSlowestRank) {
  JobView v(10);
  v.start(100);
  v.sample({rank(0, 10, 1.0, 1 << 30), rank(1, 10, 1.0, 1 << 30), rank(2, 10, 1.0, 1 << 30)},
           100);
  // 2 s later: ranks 0 and 1 made 20 steps (100 ms each), rank 2 only 10 (200 ms each) and
  // used half as much CPU.
  v.sample({rank(0, 30, 3.0, 1 << 30), rank(1, 30, 3.0, 1 << 30), rank(2, 20, 2.0, int64_t{3} << 30)},
           102);
  JobFigures f = v.figures();
  EXPECT_EQ(f.alive, 3);
  EXPECT_EQ(f.total, 3);
  EXPECT_DOUBLE_EQ(f.uptime_sec, 2);
  EXPECT_TRUE(f.stepping);
  EXPECT_EQ(f.step, 20u);  // the job is where its slowest rank is
  ASSERT_TRUE(f.steps_per_sec);
  EXPECT_DOUBLE_EQ(*f.steps_per_sec, 5);
  ASSERT_TRUE(f.slowest_global_rank);
  EXPECT_EQ(*f.slowest_global_rank, 6);
  EXPECT_DOUBLE_EQ(f.slowest_ms, 200);
  EXPECT_DOUBLE_EQ(f.median_ms, 100);
  ASSERT_EQ(f.cpu_percent.size(), 3u);
  EXPECT_DOUBLE_EQ(*f.cpu_percent[0], 100);
  EXPECT_DOUBLE_EQ(*f.cpu_percent[2], 50);
  EXPECT_EQ(v.statusLine(200),
            "ddpl | 3/3 ranks up 2s | step 20 (5/s) | slowest r6 200ms (median 100) | cpu% 100 "
            "100 50 | mem 1.0G 1.0G 3.0G");
  EXPECT_EQ(v.logLine(),
            "3/3 ranks up 2s; step 20 (5/s); slowest rank 6 200.0 ms/step (median rank 100.0); "
            "cpu% 100 100 50; mem 1.0GiB 1.0GiB 3.0GiB");
}

// Issue 33: in lockstep every rank makes the same steps in the same time, so wall time per step
// named an arbitrary rank; its own time (less the time it waited in collectives, the
// heartbeat's second field) names the one the others wait for, as the straggler warning does.
TEST(JobView, SlowestRankByItsOwnTimeInLockstep) {
  JobView v(10);
  v.start(0);
  auto lockstep = [](int lr, uint64_t step, uint64_t waited_us) {
    RankUsage u = rank(lr, step, 0, 1 << 20);
    u.waited_us = waited_us;
    return u;
  };
  v.sample({lockstep(0, 100, 0), lockstep(1, 100, 0), lockstep(2, 100, 0), lockstep(3, 100, 0)}, 0);
  // 4 s later, 100 steps of 40 ms for everyone: rank 1 (global 5) worked 39 ms of each, the
  // others 14-16 ms and waited for it the rest.
  v.sample({lockstep(0, 200, 2400000), lockstep(1, 200, 100000), lockstep(2, 200, 2600000),
            lockstep(3, 200, 2500000)},
           4);
  JobFigures f = v.figures();
  ASSERT_TRUE(f.slowest_global_rank);
  EXPECT_EQ(*f.slowest_global_rank, 5);
  EXPECT_DOUBLE_EQ(f.slowest_ms, 39);
  EXPECT_DOUBLE_EQ(f.median_ms, 15.5);  // of 16, 39, 14, 15
  EXPECT_NE(v.statusLine(200).find("slowest r5 39ms (median 16)"), std::string::npos)
      << v.statusLine(200);
}

TEST(JobView, OldSamplesLeaveTheWindowAndANewAttemptStartsAfresh) {
  JobView v(10);
  v.start(0);
  for (int t = 0; t <= 30; ++t)
    v.sample({rank(0, static_cast<uint64_t>(1 + (t < 20 ? t : 20 + 4 * (t - 20))), t, 1000)}, t);
  // The last 10 s ran at 4 steps/s; the first 20 s at 1 step/s no longer count.
  EXPECT_NEAR(*v.figures().steps_per_sec, 4, 0.01);
  v.start(40);
  v.sample({rank(0, 0, 0, 1000)}, 40);
  JobFigures f = v.figures();
  EXPECT_FALSE(f.stepping);
  EXPECT_FALSE(f.steps_per_sec);
  EXPECT_FALSE(f.cpu_percent[0]);  // one sample: no rate yet
  EXPECT_EQ(v.statusLine(100), "ddpl | 1/1 ranks up 0s | mem 1000B");
}

TEST(JobView, ManyRanksShowARangeExitedRanksADashAndGpuWhenKnown) {
  JobView v;
  v.start(0);
  std::vector<RankUsage> a, b;
  for (int i = 0; i < 16; ++i) {
    a.push_back(rank(i, 0, 0, int64_t{100} << 20));
    b.push_back(rank(i, 0, i < 8 ? 1.0 : 0.5, int64_t{100} << 20));
    b.back().gpu_util_percent = 90.0 - i;
    b.back().gpu_memory_bytes = int64_t{2} << 30;
  }
  b[3].alive = false;
  v.sample(a, 0);
  v.sample(b, 1);
  JobFigures f = v.figures();
  EXPECT_EQ(f.alive, 15);
  EXPECT_FALSE(f.cpu_percent[3]);
  std::string line = v.statusLine(1000);
  EXPECT_NE(line.find("cpu% 50..100 (median 50)"), std::string::npos) << line;
  EXPECT_NE(line.find("gpu% 75..90 (median 83)"), std::string::npos) << line;
  EXPECT_NE(line.find("gpu mem 2.0G..2.0G"), std::string::npos) << line;
  // The log line lists every rank.
  EXPECT_NE(v.logLine().find("cpu% 100 100 100 - 100"), std::string::npos) << v.logLine();
}

TEST(JobView, FitColumnsCutsAtCharactersNotBytesAndResetsColours) {
  EXPECT_EQ(fitColumns("abcdef", 4), "abcd");
  EXPECT_EQ(fitColumns("abc", 4), "abc");
  // Block characters are 3 bytes and one column each: never split.
  EXPECT_EQ(fitColumns("ab\u2588\u2588\u2588cd", 4), "ab\u2588\u2588");
  // Escapes take no columns; a cut line must not leave the colour on.
  EXPECT_EQ(fitColumns("\x1b[31mred text\x1b[0m", 3), "\x1b[31mred\x1b[0m");
  EXPECT_EQ(fitColumns("", 0), "");
  EXPECT_EQ(humanBytes(512), "512B");
  EXPECT_EQ(humanBytes(3 << 20), "3MiB");
  EXPECT_EQ(humanBytes(int64_t{5} << 30), "5.0GiB");
}
