// launcher/warm/restart_phases.h: where a restart's time went, from the agent's events.
#include "launcher/warm/restart_phases.h"

#include <gtest/gtest.h>

namespace ddpl::launcher::warm {
namespace {

// Readings with step counts only, no restore reported (a C++ worker's heartbeat).
std::optional<RestartRecord> onSteps(RestartClock& c, double t, std::vector<uint64_t> steps,
                                     double restore_seconds = 0) {
  std::vector<RankSteps> ranks;
  for (uint64_t s : steps) ranks.push_back({s, 0, RestoreSource::kNone});
  return c.onReadings(t, ranks, restore_seconds);
}

TEST(RestartPhases, AFirstStartIsNoRestart) {
  RestartClock c;
  c.onFormed(1);
  c.onStarted(2, 4, 0);
  EXPECT_EQ(onSteps(c, 3, {1, 1, 1, 1}), std::nullopt);
  EXPECT_EQ(c.onGroupEnded(), std::nullopt);
  EXPECT_EQ(c.summary(), "");
}

TEST(RestartPhases, EachPhaseFromTheFailureToEveryRanksFirstStep) {
  RestartClock c;
  c.onFormed(1);
  c.onStarted(1, 2, 0);
  c.onFailure(10.0);
  c.onFailure(10.5);  // the survivors' exits do not move the failure
  c.onStopped(10.25);
  c.onFormed(10.5);
  EXPECT_FALSE(c.awaitingFirstStep());
  c.onStarted(10.75, 2, 0);
  EXPECT_TRUE(c.awaitingFirstStep());
  EXPECT_EQ(onSteps(c, 11.0, {0, 0}), std::nullopt);
  EXPECT_EQ(onSteps(c, 11.25, {6, 0}), std::nullopt);  // every rank, not the first
  auto r = onSteps(c, 11.5, {6, 6}, 0.25);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->restart, 1);
  EXPECT_DOUBLE_EQ(r->total(), 1.5);
  EXPECT_EQ(r->describe(),
            "stop 0.25s, re-form 0.25s, start 0.25s (2 warm), first step 0.75s (checkpoint read "
            "0.25s): 1.50s in all");
  EXPECT_EQ(onSteps(c, 12, {7, 7}), std::nullopt);  // once
  EXPECT_FALSE(c.awaitingFirstStep());
  EXPECT_EQ(c.summary(), "\n  restart 1: " + r->describe());
}

TEST(RestartPhases, ARestartWhoseGroupFailsBeforeSteppingIsStillReported) {
  RestartClock c;
  c.onFailure(1);
  c.onStopped(2);
  c.onFormed(3);
  c.onStarted(4, 1, 1);
  c.onFailure(5);  // the restarted group failed before any step: restart 1 ends, 2 begins
  c.onStopped(6);
  c.onFormed(7);
  c.onStarted(8, 0, 2);
  auto last = c.onGroupEnded();  // the run ended with no step either
  ASSERT_TRUE(last);
  ASSERT_EQ(c.completed().size(), 2u);
  EXPECT_EQ(c.completed()[0].describe(),
            "stop 1.00s, re-form 1.00s, start 1.00s (1 warm, 1 cold), no step completed: 3.00s "
            "to the start");
  EXPECT_EQ(c.completed()[1].restart, 2);
  EXPECT_EQ(last->describe(),
            "stop 1.00s, re-form 1.00s, start 1.00s (2 cold), no step completed: 3.00s to the "
            "start");
}

TEST(RestartPhases, AMembershipChangeWithoutAStopStillCounts) {
  RestartClock c;
  c.onFailure(1);  // a round ended: no worker of ours failed, stop then re-form
  c.onFormed(2);   // never saw every worker exit (none was running)
  c.onStarted(3, 1, 0);
  auto r = onSteps(c, 4, {1});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->describe(),
            "stop 1.00s, re-form 0.00s, start 1.00s (1 warm), first step 1.00s: 3.00s in all");
}

// The incident table (issue 48: where each lost second went). Steps as the heartbeats give
// them: a count per local rank, and the step restored plus one with its source.
RankSteps at(uint64_t steps, uint64_t restored = 0, RestoreSource source = RestoreSource::kNone) {
  return {steps, restored, source};
}

// A first group that steps to 21 on its survivor (20 on the rank that died), a memory
// checkpoint at 15: the next group resumes at 16 reporting absolute steps and is back at 21.
RestartClock killedThenBack() {
  RestartClock c;
  c.onStarted(0, 0, 2);
  c.onReadings(1, {at(1), at(1)});
  c.onReadings(9.5, {at(20), at(20)});
  c.onReadings(9.9, {at(20), at(20)});  // no step since 9.5
  c.onFailure(10, "rank 1 (local rank 1) signal 9 (SIGKILL)");
  c.onReadings(10.1, {at(21), at(20)});  // the survivor's last step counts as done
  c.onStopped(10.25);
  c.onFormed(10.5);
  c.onStarted(10.75, 2, 0);
  const auto m = RestoreSource::kMemory;
  EXPECT_EQ(c.onReadings(10.8, {at(0, 16, m), at(0)}), std::nullopt);
  auto first = c.onReadings(11, {at(16, 16, m), at(16, 16, m)}, 0.125);
  EXPECT_TRUE(first);
  c.onReadings(11.25, {at(20, 16, m), at(21, 16, m)});  // the slowest rank is not back yet
  EXPECT_TRUE(c.takeChanged());
  c.onReadings(11.5, {at(21, 16, m), at(22, 16, m)});
  return c;
}

TEST(Incidents, AKillThenBackCountsEachLostSecondAndTheStepsRedone) {
  RestartClock c = killedThenBack();
  EXPECT_TRUE(c.takeChanged()) << "the row completed";
  EXPECT_FALSE(c.takeChanged());
  ASSERT_EQ(c.completed().size(), 1u);
  const RestartRecord& r = c.completed()[0];
  EXPECT_EQ(r.cause, "rank 1 (local rank 1) signal 9 (SIGKILL)");
  EXPECT_DOUBLE_EQ(r.detect, 0.5);  // from the last step seen (9.5), not the last reading
  EXPECT_EQ(r.before, 21u);
  ASSERT_TRUE(r.restored);
  EXPECT_EQ(*r.restored, 15u);
  EXPECT_EQ(r.source, RestoreSource::kMemory);
  EXPECT_EQ(r.recomputed(), 6u);
  EXPECT_DOUBLE_EQ(r.back, 11.5);
  EXPECT_DOUBLE_EQ(r.lost(), 2.0);  // 0.5 to see it, 1.5 from the failure to back
  EXPECT_EQ(c.incidentTable(40),
            "where each lost second went (seconds; detect counts from the last step a rank of "
            "this node completed; back: from the failure until the group's step was again the "
            "highest before it; lost = detect + back):\n"
            "  # detect stop re-form start first step restore                 recomputed back "
            "lost cause\n"
            "  1 0.50   0.25 0.25    0.25  0.25       memory step 15 in 0.12s 6          1.50 "
            "2.00 rank 1 (local rank 1) signal 9 (SIGKILL)\n"
            "  totals: 1 incident, 2.00s lost (5.0% of 40.0s wall time)");
  // The log's one line per restart is what it was.
  EXPECT_EQ(c.summary(), "\n  restart 1: " + r.describe());
}

TEST(Incidents, StepsCountedFromOneInTheAttemptAddToTheStepRestored) {
  RestartClock c;
  c.onStarted(0, 1, 0);
  c.onReadings(1, {at(30)});
  c.onFailure(2, "rank 0 (local rank 0) exit code 1");
  c.onFormed(3);
  c.onStarted(4, 1, 0);
  const auto d = RestoreSource::kDisk;
  c.onReadings(5, {at(2, 21, d)});  // 2 is not above the 20 restored: a count from 1
  ASSERT_EQ(c.completed().size(), 1u);
  EXPECT_EQ(c.completed()[0].back, 0);
  c.onReadings(6, {at(9, 21, d)});  // 29
  EXPECT_EQ(c.completed()[0].back, 0);
  c.onReadings(7, {at(10, 21, d)});  // 30
  EXPECT_EQ(c.completed()[0].back, 7);
  EXPECT_EQ(c.completed()[0].recomputed(), 10u);
  EXPECT_EQ(c.completed()[0].source, d);
  EXPECT_DOUBLE_EQ(c.completed()[0].detect, 1);
}

TEST(Incidents, AHangIsSeenAboutTheHangTimeoutAfterTheLastStep) {
  RestartClock c;
  c.onStarted(0, 0, 2);
  for (int t = 1; t <= 5; ++t) c.onReadings(t, {at(t), at(t)});
  for (int t = 6; t <= 15; ++t) c.onReadings(t, {at(5), at(5)});  // rank 1 holds rank 0 up
  c.onFailure(15.5, "hang: rank 1 made no step");
  c.onStopped(16);
  c.onFormed(16.5);
  c.onStarted(17, 0, 2);
  c.onReadings(18, {at(1), at(1)});  // nothing restored: every step redone
  c.onReadings(19, {at(5), at(5)});
  ASSERT_EQ(c.completed().size(), 1u);
  const RestartRecord& r = c.completed()[0];
  EXPECT_DOUBLE_EQ(r.detect, 10.5);
  EXPECT_FALSE(r.restored);
  EXPECT_EQ(r.recomputed(), 5u);
  EXPECT_DOUBLE_EQ(r.back, 19);
  EXPECT_NE(c.incidentTable().find(" none "), std::string::npos) << c.incidentTable();
  EXPECT_NE(c.incidentTable().find("14.00 hang: rank 1 made no step"), std::string::npos)
      << c.incidentTable();
}

TEST(Incidents, AGroupThatEndsOrFailsBeforeItIsBackLeavesItsRowNotBack) {
  RestartClock c;
  c.onStarted(0, 0, 1);
  c.onReadings(1, {at(10)});
  c.onFailure(2, "round ended: node 1 left");
  c.onFormed(3);
  c.onStarted(4, 0, 1);
  const auto p = RestoreSource::kPeer;
  c.onReadings(5, {at(6, 6, p)});  // resumed at 5 (a peer's copy), absolute
  c.onReadings(6, {at(8, 6, p)});
  // It fails again at step 8: the first row is not back; it lost up to this one's last step.
  c.onFailure(7, "rank 0 (local rank 0) signal 6 (SIGABRT)");
  ASSERT_EQ(c.completed().size(), 1u);
  EXPECT_DOUBLE_EQ(c.completed()[0].ended, 6);
  EXPECT_EQ(c.completed()[0].back, 0);
  EXPECT_DOUBLE_EQ(c.completed()[0].lost(), 4 + 1);
  c.onFormed(8);
  c.onStarted(9, 0, 1);
  c.onReadings(10, {at(7, 7, p)});  // resumed at 6, its step 7 of the 8: the run ends first
  c.onGroupEnded(10.5);
  ASSERT_EQ(c.completed().size(), 2u);
  EXPECT_DOUBLE_EQ(c.completed()[1].ended, 10.5);
  EXPECT_EQ(c.completed()[1].before, 8u);
  EXPECT_EQ(c.completed()[1].recomputed(), 2u);
  std::string t = c.incidentTable();
  EXPECT_NE(t.find("peer step 5"), std::string::npos) << t;
  EXPECT_NE(t.find("not back >=5.00 round ended: node 1 left"), std::string::npos) << t;
  EXPECT_NE(t.find("not back >=4.50 rank 0 (local rank 0) signal 6 (SIGABRT)"), std::string::npos)
      << t;
  EXPECT_NE(t.find("totals: 2 incidents, at least 9.50s lost"), std::string::npos) << t;
  EXPECT_EQ(t.find("wall time"), std::string::npos) << "no wall time given";
}

TEST(Incidents, TheFarthestSourceAndTheLowestStepOfTheRanksAreTheRows) {
  EXPECT_EQ(restoreSourceFromCode(1), RestoreSource::kMemory);
  EXPECT_EQ(restoreSourceFromCode(3), RestoreSource::kDisk);
  EXPECT_EQ(restoreSourceFromCode(0), RestoreSource::kNone);
  EXPECT_EQ(restoreSourceFromCode(4), RestoreSource::kNone);  // a worker's number: checked
  EXPECT_EQ(restoreSourceFromCode(~uint64_t{0}), RestoreSource::kNone);
  RestartClock c;
  c.onStarted(0, 0, 3);
  c.onReadings(1, {at(9), at(9), at(9)});
  c.onFailure(2, "x");
  c.onFormed(3);
  c.onStarted(4, 0, 3);
  c.onReadings(5, {at(9, 9, RestoreSource::kMemory), at(9, 9, RestoreSource::kPeer),
                   at(9, 9, RestoreSource::kDisk)});
  ASSERT_EQ(c.completed().size(), 1u);
  EXPECT_EQ(c.completed()[0].source, RestoreSource::kDisk);
  EXPECT_EQ(*c.completed()[0].restored, 8u);
  EXPECT_DOUBLE_EQ(c.completed()[0].back, 5);
}

TEST(Incidents, TheTableKeepsItsNewestRowsAndTheTotalsCountThemAll) {
  RestartClock c;
  c.onStarted(0, 0, 1);
  const auto m = RestoreSource::kMemory;
  for (uint64_t i = 0; i < 5; ++i) {
    double t = 10.0 * static_cast<double>(i + 1);
    uint64_t step = 10 * i + 5;  // each group reaches it a second before it fails
    c.onReadings(t - 1, {at(step, i == 0 ? 0 : step - 10 + 1, m)});
    c.onFailure(t, "rank 0 (local rank 0) signal 9 (SIGKILL)");
    c.onFormed(t + 1);
    c.onStarted(t + 2, 0, 1);
    c.onReadings(t + 3, {at(step, step, m)});  // resumed at step - 1: back 3s after the failure
  }
  ASSERT_EQ(c.completed().size(), 5u);
  std::string t = c.incidentTable(100, 2);
  EXPECT_NE(t.find("\n  3 earlier incident(s) not shown\n"), std::string::npos) << t;
  EXPECT_EQ(t.find("\n  1 "), std::string::npos) << t;
  EXPECT_NE(t.find("\n  4 "), std::string::npos) << t;
  EXPECT_NE(t.find("\n  5 "), std::string::npos) << t;
  EXPECT_NE(t.find("totals: 5 incidents, 20.00s lost (20.0% of 100.0s wall time)"),
            std::string::npos)
      << t;
  EXPECT_EQ(RestartClock().incidentTable(), "") << "no restart, no table";
}

}  // namespace
}  // namespace ddpl::launcher::warm
