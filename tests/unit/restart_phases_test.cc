// launcher/warm/restart_phases.h: where a restart's time went, from the agent's events.
#include "launcher/warm/restart_phases.h"

#include <gtest/gtest.h>

namespace ddpl::launcher::warm {
namespace {

TEST(RestartPhases, AFirstStartIsNoRestart) {
  RestartClock c;
  c.onFormed(1);
  c.onStarted(2, 4, 0);
  EXPECT_EQ(c.onSteps(3, {1, 1, 1, 1}), std::nullopt);
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
  EXPECT_EQ(c.onSteps(11.0, {0, 0}), std::nullopt);
  EXPECT_EQ(c.onSteps(11.25, {6, 0}), std::nullopt);  // every rank, not the first
  auto r = c.onSteps(11.5, {6, 6}, 0.25);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->restart, 1);
  EXPECT_DOUBLE_EQ(r->total(), 1.5);
  EXPECT_EQ(r->describe(),
            "stop 0.25s, re-form 0.25s, start 0.25s (2 warm), first step 0.75s (checkpoint read "
            "0.25s): 1.50s in all");
  EXPECT_EQ(c.onSteps(12, {7, 7}), std::nullopt);  // once
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
  auto r = c.onSteps(4, {1});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->describe(),
            "stop 1.00s, re-form 0.00s, start 1.00s (1 warm), first step 1.00s: 3.00s in all");
}

}  // namespace
}  // namespace ddpl::launcher::warm
