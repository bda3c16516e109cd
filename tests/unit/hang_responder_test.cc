#include "launcher/agent/hang_responder.h"

#include <gtest/gtest.h>

namespace ddpl::launcher {
namespace {

// Local ranks 0..3 of a node whose first global rank is 4.
std::vector<WorkerState> fourRanks() {
  return {{0, 4, 100, true}, {1, 5, 101, true}, {2, 6, 102, true}, {3, 7, 103, true}};
}

// As the stacks service makes it: py-spy's frames of the main thread, the program's marked.
StackSummary stack(bool in_collective, const std::string& innermost) {
  StackSummary s;
  s.in_collective = in_collective;
  s.innermost = {innermost};
  if (in_collective)
    s.frames = {{innermost + " (torch/distributed/distributed_c10d.py:2942)", false, ""},
                {"main (train.py:41)", true, "dist.all_reduce(t)"}};
  else
    s.frames = {{innermost + " (train.py:20)", true, ""}, {"main (train.py:41)", true, ""}};
  return s;
}

Hang hung(int local_rank) { return Hang{local_rank, 7, 6, "no step for 7.0s (limit 6.0s)"}; }

TEST(HangResponder, TheRankOutsideTheCollectiveIsTheFirstFailureTheOthersKeepTheirOrder) {
  HangResponder r("hostA");
  ProgressTracker progress;
  progress.start(4, 4, 990);
  std::string why = r.begin({hung(0), hung(2), hung(3)}, 1000, fourRanks(), "/run/attempt_1", 1,
                            progress, nullptr);
  EXPECT_EQ(why, "hang: rank(s) 4, 6, 7 on node 1 (hostA)");
  EXPECT_TRUE(r.busy());
  HangStacks h;
  h.attempt = 1;
  h.summaries = {{0, stack(true, "all_reduce")},
                 {1, stack(true, "all_reduce")},
                 {2, stack(false, "load_batch")},
                 {3, stack(true, "all_reduce")}};
  r.onStacksSaved(h);
  h.remote = {"node 0 (hostB): 2 stack(s) saved in /elsewhere"};
  auto failures = r.finish(h);
  EXPECT_FALSE(r.busy());
  ASSERT_EQ(failures.size(), 3u);
  EXPECT_EQ(failures[0].exit.local_rank, 2);
  EXPECT_EQ(failures[1].exit.local_rank, 0);
  EXPECT_EQ(failures[2].exit.local_rank, 3);
  const FailureDetail& culprit = failures[0];
  EXPECT_EQ(culprit.global_rank, 6);
  EXPECT_EQ(culprit.exit.pid, 102);
  EXPECT_EQ(culprit.exit.unix_time, 1000);
  EXPECT_TRUE(culprit.exit.status.hung);
  EXPECT_EQ(culprit.exit.status.value, kHangExitCode);
  EXPECT_FALSE(culprit.exit.stopped_by_us);
  EXPECT_EQ(culprit.host, "hostA");
  EXPECT_EQ(culprit.error_file, "/run/attempt_1/2/stacks.txt");
  ASSERT_TRUE(culprit.error.has_value());
  EXPECT_EQ(culprit.error->message, "hung: no step for 7.0s (limit 6.0s)");
  EXPECT_EQ(culprit.error->traceback, "load_batch\n");
  EXPECT_EQ(culprit.error->timestamp, "1000");
}

TEST(HangResponder, NoCulpritWhenEveryRankIsOutsideACollectiveOrNoStackWasTaken) {
  for (bool any_stack : {true, false}) {
    HangResponder r("hostA");
    ProgressTracker progress;
    progress.start(4, 4, 990);
    r.begin({hung(3), hung(1)}, 1000, fourRanks(), "/run/attempt_0", 0, progress, nullptr);
    HangStacks h;
    if (any_stack)
      for (int lr = 0; lr < 4; ++lr) h.summaries[lr] = stack(false, "compute");
    r.onStacksSaved(h);
    auto failures = r.finish(h);
    ASSERT_EQ(failures.size(), 2u);
    EXPECT_EQ(failures[0].exit.local_rank, 3);
    EXPECT_EQ(failures[1].exit.local_rank, 1);
    EXPECT_EQ(failures[1].error->traceback, any_stack ? "compute\n" : "");
  }
}

}  // namespace
}  // namespace ddpl::launcher
