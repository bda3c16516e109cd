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
