#include "launcher/agent/supervisor.h"

#include <gtest/gtest.h>

#include <csignal>

using namespace ddpl::launcher;
using K = Action::Kind;
using Actions = std::vector<Action>;

namespace {
Supervisor make(int nproc, int restarts) {
  return Supervisor({nproc, restarts, {SIGTERM, SIGINT, SIGHUP, SIGQUIT}});
}
void startRunning(Supervisor& s) {
  ASSERT_EQ(s.start(), (Actions{{K::kStartRendezvous, 0}}));
  ASSERT_EQ(s.phase(), Phase::kRendezvous);
  ASSERT_EQ(s.onRendezvousComplete(0), (Actions{{K::kStartGroup, 0}}));
}
const ExitStatus kOk{false, 0};
}  // namespace

TEST(Supervisor, AllSucceed) {
  auto s = make(3, 0);
  startRunning(s);
  EXPECT_TRUE(s.onWorkerExit(0, 100, kOk, 1).empty());
  EXPECT_TRUE(s.onWorkerExit(2, 102, kOk, 1).empty());
  EXPECT_EQ(s.onWorkerExit(1, 101, kOk, 1), (Actions{{K::kExit, 0}}));
  EXPECT_EQ(s.phase(), Phase::kDone);
}

TEST(Supervisor, FailureStopsOthersRecordsThenRestarts) {
  auto s = make(3, 1);
  startRunning(s);
  auto a = s.onWorkerExit(1, 101, {false, 3}, 10);
  EXPECT_EQ(a, (Actions{{K::kTerminateAll, SIGTERM}, {K::kArmShutdownTimer, 0}}));
  EXPECT_EQ(s.phase(), Phase::kStopping);
  EXPECT_TRUE(s.onWorkerExit(0, 100, {true, SIGTERM}, 11).empty());
  EXPECT_EQ(s.onWorkerExit(2, 102, {true, SIGTERM}, 11), (Actions{{K::kRecordFailure, 0}}));
  EXPECT_EQ(s.phase(), Phase::kRecording);
  EXPECT_EQ(s.onFailureRecorded(1), (Actions{{K::kStartRendezvous, 0}}));
  EXPECT_EQ(s.onRendezvousComplete(1), (Actions{{K::kStartGroup, 1}}));
  EXPECT_EQ(s.restartCount(), 1);
  EXPECT_EQ(s.phase(), Phase::kRunning);
  EXPECT_EQ(s.liveWorkers(), 3);
}

TEST(Supervisor, RestartsExhaustedExitWithRootCauseCode) {
  auto s = make(2, 1);
  startRunning(s);
  s.onWorkerExit(0, 100, {false, 7}, 1);
  s.onWorkerExit(1, 101, {true, SIGTERM}, 2);
  s.onFailureRecorded(1);
  s.onRendezvousComplete(1);
  s.onWorkerExit(1, 201, {true, SIGSEGV}, 3);  // root cause of the last attempt
  EXPECT_EQ(s.onWorkerExit(0, 200, {false, 1}, 4), (Actions{{K::kRecordFailure, 0}}));
  EXPECT_EQ(s.onFailureRecorded(2), (Actions{{K::kExit, 128 + SIGSEGV}}));
  ASSERT_NE(s.rootCause(), nullptr);
  EXPECT_EQ(s.rootCause()->pid, 201);
  EXPECT_FALSE(s.rootCause()->stopped_by_us);
  EXPECT_TRUE(s.failuresByAttempt().back().back().stopped_by_us);
}

TEST(Supervisor, JobWideCountDecides) {
  // Another node's failures count too: this node's first failure may already exhaust them.
  auto s = make(1, 2);
  startRunning(s);
  s.onWorkerExit(0, 100, {false, 4}, 1);
  EXPECT_EQ(s.onFailureRecorded(3), (Actions{{K::kExit, 4}}));
}

TEST(Supervisor, JobAlreadyFailedElsewhere) {
  auto s = make(2, 1);
  s.start();
  EXPECT_EQ(s.onRendezvousComplete(2), (Actions{{K::kExit, 1}}));
  EXPECT_EQ(s.stopReason(), StopReason::kJobFailedElsewhere);
}

TEST(Supervisor, RendezvousFailureExits) {
  auto s = make(2, 1);
  s.start();
  EXPECT_EQ(s.onRendezvousFailed(), (Actions{{K::kExit, 1}}));
  EXPECT_EQ(s.stopReason(), StopReason::kRendezvousFailed);
}

TEST(Supervisor, MembershipChangeRejoinsWithoutUsingARestart) {
  auto s = make(2, 0);
  startRunning(s);
  EXPECT_EQ(s.onMembershipChange(),
            (Actions{{K::kTerminateAll, SIGTERM}, {K::kArmShutdownTimer, 0}}));
  EXPECT_TRUE(s.onMembershipChange().empty());  // already stopping
  s.onWorkerExit(0, 100, {true, SIGTERM}, 1);
  EXPECT_EQ(s.onWorkerExit(1, 101, {false, 1}, 1), (Actions{{K::kStartRendezvous, 0}}));
  EXPECT_EQ(s.onRendezvousComplete(0), (Actions{{K::kStartGroup, 0}}));
  EXPECT_EQ(s.restartCount(), 0);
}

// A node evicted while stopped (SIGSTOP past the heartbeat window) finds its workers dead of
// the re-formed group when it continues: re-join, no restart used, and no root cause left.
TEST(Supervisor, FailureAfterTheRoundEndedRejoinsWithoutUsingARestart) {
  auto s = make(2, 0);
  startRunning(s);
  EXPECT_EQ(s.onWorkerExit(0, 100, {false, 1}, 1),
            (Actions{{K::kTerminateAll, SIGTERM}, {K::kArmShutdownTimer, 0}}));
  EXPECT_EQ(s.onWorkerExit(1, 101, {true, SIGTERM}, 1), (Actions{{K::kRecordFailure, 0}}));
  EXPECT_EQ(s.onFailureOutlivedRound(), (Actions{{K::kStartRendezvous, 0}}));
  EXPECT_EQ(s.rootCause(), nullptr);
  EXPECT_EQ(s.onRendezvousComplete(0), (Actions{{K::kStartGroup, 0}}));
  EXPECT_EQ(s.restartCount(), 0);
  // Only from the recording phase.
  EXPECT_TRUE(s.onFailureOutlivedRound().empty());
  EXPECT_EQ(s.phase(), Phase::kRunning);
}

TEST(Supervisor, MembershipChangeIgnoredOutsideRunning) {
  auto s = make(1, 0);
  s.start();
  EXPECT_TRUE(s.onMembershipChange().empty());
  EXPECT_EQ(s.phase(), Phase::kRendezvous);
}

TEST(Supervisor, LastWorkerFailingNeedsNoTermination) {
  auto s = make(2, 0);
  startRunning(s);
  s.onWorkerExit(0, 100, kOk, 1);
  EXPECT_EQ(s.onWorkerExit(1, 101, {false, 4}, 2), (Actions{{K::kRecordFailure, 0}}));
  EXPECT_EQ(s.onFailureRecorded(1), (Actions{{K::kExit, 4}}));
}

TEST(Supervisor, StopSignalForwardsAndExitsWith128PlusN) {
  auto s = make(2, 3);
  startRunning(s);
  EXPECT_EQ(s.onSignal(SIGTERM), (Actions{{K::kTerminateAll, SIGTERM}, {K::kArmShutdownTimer, 0}}));
  s.onWorkerExit(0, 100, {true, SIGTERM}, 1);
  // No restart after a stop request, even with restarts left.
  EXPECT_EQ(s.onWorkerExit(1, 101, {false, 1}, 1), (Actions{{K::kExit, 128 + SIGTERM}}));
}

TEST(Supervisor, StopSignalWhileWaitingForRendezvousExitsAtOnce) {
  auto s = make(2, 3);
  s.start();
  EXPECT_TRUE(s.onSignal(SIGUSR1).empty());
  EXPECT_EQ(s.onSignal(SIGTERM), (Actions{{K::kExit, 128 + SIGTERM}}));
  EXPECT_TRUE(s.onRendezvousComplete(0).empty());  // too late: nothing starts
}

TEST(Supervisor, OtherSignalsAreOnlyForwarded) {
  auto s = make(2, 0);
  startRunning(s);
  EXPECT_EQ(s.onSignal(SIGUSR1), (Actions{{K::kForwardSignal, SIGUSR1}}));
  EXPECT_EQ(s.phase(), Phase::kRunning);
}

TEST(Supervisor, SecondStopSignalKills) {
  auto s = make(1, 0);
  startRunning(s);
  s.onSignal(SIGINT);
  EXPECT_EQ(s.onSignal(SIGINT), (Actions{{K::kKillAll, 0}}));
}

TEST(Supervisor, ShutdownTimeoutKillsOnlyWhileStopping) {
  auto s = make(2, 0);
  startRunning(s);
  EXPECT_TRUE(s.onShutdownTimeout().empty());
  s.onWorkerExit(0, 100, {false, 1}, 1);
  EXPECT_EQ(s.onShutdownTimeout(), (Actions{{K::kKillAll, 0}}));
}

TEST(Supervisor, SignalDuringFailureStopPreventsRestart) {
  auto s = make(2, 5);
  startRunning(s);
  s.onWorkerExit(0, 100, {false, 1}, 1);
  EXPECT_EQ(s.onSignal(SIGTERM), (Actions{{K::kForwardSignal, SIGTERM}}));
  EXPECT_EQ(s.onWorkerExit(1, 101, {true, SIGTERM}, 2), (Actions{{K::kExit, 128 + SIGTERM}}));
}

TEST(Supervisor, StaleAndUnknownExitsIgnored) {
  auto s = make(2, 0);
  startRunning(s);
  EXPECT_TRUE(s.onWorkerExit(5, 1, kOk, 0).empty());
  s.onWorkerExit(0, 100, kOk, 0);
  EXPECT_TRUE(s.onWorkerExit(0, 100, {false, 1}, 0).empty());  // already exited
  EXPECT_EQ(s.phase(), Phase::kRunning);
}

TEST(Supervisor, ManyRestartsCountUp) {
  auto s = make(4, 100);
  startRunning(s);
  for (int r = 1; r <= 100; ++r) {
    s.onWorkerExit(r % 4, r, {false, 2}, r);
    std::vector<int> stopped;
    for (int lr = 0; lr < 4; ++lr)
      if (s.isLive(lr)) stopped.push_back(lr);
    for (int lr : stopped) s.onWorkerExit(lr, 1000 + lr, {true, SIGTERM}, r);
    ASSERT_EQ(s.phase(), Phase::kRecording);
    s.onFailureRecorded(r);
    s.onRendezvousComplete(r);
    EXPECT_EQ(s.restartCount(), r);
  }
  s.onWorkerExit(0, 1, {false, 2}, 0);
  for (int lr = 1; lr < 4; ++lr) s.onWorkerExit(lr, 1, {true, SIGTERM}, 0);
  s.onFailureRecorded(101);
  EXPECT_EQ(s.phase(), Phase::kDone);
  EXPECT_EQ(s.exitCode(), 2);
}

TEST(ExitStatus, Describe) {
  EXPECT_EQ((ExitStatus{false, 3}).describe(), "exit code 3");
  EXPECT_EQ((ExitStatus{true, 9}).describe(), "signal 9 (SIGKILL)");
  EXPECT_EQ((ExitStatus{true, 9}).shellCode(), 137);
}
