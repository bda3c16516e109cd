// The rendezvous state machine on a fake clock: every timeout is driven by explicit tick()s,
// so these tests are deterministic and take no wall time.
#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <numeric>
#include <random>

#include "rendezvous/state/rendezvous_state.h"

namespace ddpl::rdzv {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using ::testing::HasSubstr;

class StateTest : public ::testing::Test {
 protected:
  TimePoint t0_ = TimePoint{} + std::chrono::hours(1);
  TimePoint now_ = t0_;
  RendezvousState state_{RendezvousStateOptions{seconds(30)}};
  std::map<JoinTicket, JoinOutcome> outcomes_;
  std::vector<Invalidation> invalidated_;

  void absorb(Effects& fx) {
    for (auto& o : fx.joins) outcomes_[o.ticket] = o;
    for (auto& i : fx.invalidated) invalidated_.push_back(i);
  }

  JoinTicket join(const std::string& run, const std::string& node, int min, int max, int lws = 1,
                  std::string version = "1.0", Duration last_call = seconds(10),
                  Duration join_timeout = seconds(60)) {
    Effects fx;
    JoinSpec s{run, {node, lws, version, node + ".example"}, {min, max, join_timeout, last_call}};
    JoinTicket t = state_.join(s, now_, fx);
    absorb(fx);
    return t;
  }
  void advance(Duration d) {
    now_ += d;
    Effects fx;
    state_.tick(now_, fx);
    absorb(fx);
  }
  bool resolved(JoinTicket t) const { return outcomes_.count(t) > 0; }
  const JoinOutcome& outcome(JoinTicket t) const { return outcomes_.at(t); }
};

TEST_F(StateTest, RoundCompletesAtOnceAtMaxNodesWithRanksByNodeId) {
  auto c = join("r", "c", 1, 3, 2);
  auto a = join("r", "a", 1, 3, 4);
  EXPECT_FALSE(resolved(a));
  auto b = join("r", "b", 1, 3, 1);
  ASSERT_TRUE(resolved(a) && resolved(b) && resolved(c));
  for (auto t : {a, b, c}) ASSERT_TRUE(outcome(t).status.ok()) << outcome(t).status.message;
  EXPECT_EQ(outcome(a).group_rank, 0);
  EXPECT_EQ(outcome(b).group_rank, 1);
  EXPECT_EQ(outcome(c).group_rank, 2);
  const auto& m = *outcome(a).round;
  EXPECT_EQ(m.round, 0);
  EXPECT_EQ(m.world_size, 7);
  EXPECT_EQ(m.rank_offsets, (std::vector<int32_t>{0, 4, 5}));
  EXPECT_EQ(m.nodes[2].address, "c.example");
  EXPECT_EQ(outcome(b).round.get(), outcome(c).round.get()) << "one membership, shared";
}

TEST_F(StateTest, LastCallCompletesAfterMinNodes) {
  auto a = join("r", "a", 2, 4);
  advance(seconds(5));
  auto b = join("r", "b", 2, 4);
  ASSERT_TRUE(state_.nextDeadline().has_value());
  EXPECT_EQ(*state_.nextDeadline(), now_ + seconds(10));
  advance(milliseconds(9999));
  EXPECT_FALSE(resolved(a));
  auto c = join("r", "c", 2, 4);  // arrives during the last call and makes it in
  advance(milliseconds(1));
  ASSERT_TRUE(resolved(a) && resolved(b) && resolved(c));
  EXPECT_EQ(outcome(c).round->nodes.size(), 3u);
}

TEST_F(StateTest, JoinTimeoutFailsTheRoundWithNumbersAndStartsOver) {
  auto a = join("r", "a", 3, 4);
  auto b = join("r", "b", 3, 4);
  advance(seconds(59));
  EXPECT_FALSE(resolved(a));
  advance(seconds(1));
  ASSERT_TRUE(resolved(a) && resolved(b));
  EXPECT_EQ(outcome(a).status.code, RdzvCode::kDeadlineExceeded);
  EXPECT_THAT(outcome(a).status.message, HasSubstr("2/4 nodes joined (min 3)"));
  EXPECT_THAT(outcome(a).status.message, HasSubstr("60s"));
  EXPECT_EQ(state_.status("r")->joining, 0);
  // Nothing to time out any more; only the empty run's retention is left.
  EXPECT_EQ(*state_.nextDeadline(), now_ + kDefaultRunRetention);
  auto c = join("r", "c", 3, 4);  // a fresh window for the next attempt
  EXPECT_EQ(*state_.nextDeadline(), now_ + seconds(60));
  EXPECT_FALSE(resolved(c));
}

TEST_F(StateTest, ValidationErrorsNameTheProblem) {
  auto t = join("", "a", 1, 1);
  EXPECT_EQ(outcome(t).status.code, RdzvCode::kInvalidArgument);
  t = join("r", "a", 3, 2);
  EXPECT_EQ(outcome(t).status.code, RdzvCode::kInvalidArgument);
  EXPECT_THAT(outcome(t).status.message, HasSubstr("3:2"));
  t = join("r", "a", 0, 2);
  EXPECT_EQ(outcome(t).status.code, RdzvCode::kInvalidArgument);
  t = join("r", "", 1, 2);
  EXPECT_EQ(outcome(t).status.code, RdzvCode::kInvalidArgument);
  t = join("r", "a", 1, 2, 0);
  EXPECT_EQ(outcome(t).status.code, RdzvCode::kInvalidArgument);

  auto a = join("r", "a", 2, 2);
  EXPECT_FALSE(resolved(a));
  t = join("r", "a", 2, 2);
  EXPECT_EQ(outcome(t).status.code, RdzvCode::kFailedPrecondition);
  EXPECT_THAT(outcome(t).status.message, HasSubstr("duplicate node id 'a'"));
  t = join("r", "b", 2, 2, 1, "2.0");
  EXPECT_EQ(outcome(t).status.code, RdzvCode::kFailedPrecondition);
  EXPECT_THAT(outcome(t).status.message, HasSubstr("version skew"));
  EXPECT_THAT(outcome(t).status.message, HasSubstr("'2.0'"));
  t = join("r", "b", 1, 8);
  EXPECT_EQ(outcome(t).status.code, RdzvCode::kFailedPrecondition);
  EXPECT_THAT(outcome(t).status.message, HasSubstr("2:2"));
  EXPECT_FALSE(resolved(a)) << "bad joiners must not disturb the healthy one";
  auto b = join("r", "b", 2, 2);
  EXPECT_TRUE(outcome(a).status.ok() && outcome(b).status.ok());
}

TEST_F(StateTest, ArrivalWithRoomInvalidatesRoundAndEveryoneReforms) {
  auto a = join("r", "a", 1, 3, 1, "1.0", seconds(0));
  ASSERT_TRUE(outcome(a).status.ok());  // last call 0: complete at min
  auto c = join("r", "c", 1, 3, 1, "1.0", seconds(0));
  ASSERT_EQ(invalidated_.size(), 1u);
  EXPECT_EQ(invalidated_[0].round, 0);
  EXPECT_THAT(invalidated_[0].reason, HasSubstr("'c' wants to join"));
  // c alone would complete round 1 (min 1, last call 0), but a's workers of round 0 may still
  // train until a learns of the end or its heartbeat window runs out: round 1 waits for it.
  EXPECT_FALSE(resolved(c));
  auto a2 = join("r", "a", 1, 3, 1, "1.0", seconds(0));  // a stopped its workers: re-forms
  ASSERT_TRUE(resolved(c) && resolved(a2));
  EXPECT_EQ(outcome(c).round->round, 1);
  EXPECT_EQ(outcome(c).round->nodes.size(), 2u);
  EXPECT_EQ(invalidated_.size(), 1u);
}

TEST_F(StateTest, MemberThatDoesNotRejoinHoldsTheNextRoundUntilItsHeartbeatWindowEnds) {
  auto a = join("r", "a", 1, 3, 1, "1.0", seconds(0));
  auto b = join("r", "b", 1, 3, 1, "1.0", seconds(0));  // room: round 1 forms with a and b
  auto a1 = join("r", "a", 1, 3, 1, "1.0", seconds(0));
  ASSERT_TRUE(resolved(a1) && resolved(b));
  ASSERT_EQ(outcome(b).round->nodes.size(), 2u);
  advance(seconds(5));
  ASSERT_TRUE(state_.heartbeat("r", "a", 1, now_, nullptr).ok());
  advance(seconds(3));
  ASSERT_TRUE(state_.heartbeat("r", "b", 1, now_, nullptr).ok());
  const TimePoint a_seen = now_ - seconds(3);
  advance(seconds(2));
  // b's workers fail and it re-joins; a is cut from the server (no heartbeat, no re-join), so
  // its workers may train on until its agent fences: 30 s after its last heartbeat.
  auto b2 = join("r", "b", 1, 3, 1, "1.0", seconds(0));
  ASSERT_EQ(invalidated_.size(), 2u);
  ASSERT_TRUE(state_.nextDeadline().has_value());
  EXPECT_EQ(*state_.nextDeadline(), a_seen + seconds(30));
  advance(std::chrono::duration_cast<Duration>(a_seen + seconds(30) - now_) - milliseconds(1));
  EXPECT_FALSE(resolved(b2));
  advance(milliseconds(1));
  ASSERT_TRUE(resolved(b2));
  EXPECT_EQ(outcome(b2).round->round, 2);
  EXPECT_EQ(outcome(b2).round->nodes.size(), 1u) << "a's agent has fenced itself by now";
  (void)a;
}

TEST_F(StateTest, MemberThatLeavesOrIsLostIsNotWaitedFor) {
  for (auto n : {"a", "b", "c"}) join("r", n, 1, 3);
  ASSERT_EQ(state_.status("r")->phase, RendezvousState::Phase::kComplete);
  auto a1 = join("r", "a", 1, 3);
  ASSERT_TRUE(state_.nextDeadline().has_value());
  EXPECT_EQ(*state_.nextDeadline(), now_ + seconds(30)) << "b and c may still train";
  Effects fx;
  ASSERT_TRUE(state_.leave("r", "b", now_, fx).ok());  // b's agent stopped its workers
  absorb(fx);
  EXPECT_FALSE(resolved(a1)) << "c may still train";
  auto c1 = join("r", "c", 1, 3);
  ASSERT_TRUE(resolved(a1) && resolved(c1));
  EXPECT_EQ(outcome(a1).round->nodes.size(), 2u);
  // Evicted for missed heartbeats, a and c are past their windows: the next round has only
  // its last call to wait for.
  advance(seconds(31));
  ASSERT_EQ(invalidated_.size(), 2u);
  EXPECT_THAT(invalidated_[1].reason, HasSubstr("evicted"));
  auto a2 = join("r", "a", 1, 3);
  ASSERT_TRUE(state_.nextDeadline().has_value());
  EXPECT_EQ(*state_.nextDeadline(), now_ + seconds(10));
  auto c2 = join("r", "c", 1, 3);
  advance(seconds(10));
  EXPECT_TRUE(resolved(a2) && resolved(c2));
}

TEST_F(StateTest, ArrivalAtFullRoundWaitsWithoutDisturbingIt) {
  auto a = join("r", "a", 1, 2);
  auto b = join("r", "b", 1, 2);
  ASSERT_TRUE(outcome(a).status.ok() && outcome(b).status.ok());
  auto c = join("r", "c", 1, 2);
  EXPECT_FALSE(resolved(c));
  EXPECT_TRUE(invalidated_.empty());
  int32_t waiting = -1;
  EXPECT_TRUE(state_.heartbeat("r", "a", 0, now_, &waiting).ok());
  EXPECT_EQ(waiting, 1);
  // More than max waiting is refused.
  auto d = join("r", "d", 1, 2);
  auto e = join("r", "e", 1, 2);
  EXPECT_FALSE(resolved(d));
  EXPECT_EQ(outcome(e).status.code, RdzvCode::kResourceExhausted);
  EXPECT_THAT(outcome(e).status.message, HasSubstr("2/2 nodes"));
  // a leaves: the round ends for b, the waiting nodes fill round 1, which still waits for b
  // (its workers may train until it learns of the end).
  Effects fx;
  EXPECT_TRUE(state_.leave("r", "a", now_, fx).ok());
  absorb(fx);
  ASSERT_EQ(invalidated_.size(), 1u);
  EXPECT_THAT(invalidated_[0].reason, HasSubstr("'a' left"));
  EXPECT_FALSE(resolved(c) || resolved(d));
  // b re-joins, its workers stopped: round 1 is full, so b waits for round 2, and round 1
  // completes at once.
  auto b1 = join("r", "b", 1, 2);
  ASSERT_TRUE(resolved(c) && resolved(d));
  EXPECT_FALSE(resolved(b1));
  EXPECT_EQ(outcome(c).round->round, 1);
  EXPECT_EQ(state_.status("r")->phase, RendezvousState::Phase::kComplete);
  EXPECT_EQ(state_.status("r")->waiting, 1);
}

TEST_F(StateTest, MissedHeartbeatsEvictOnTheServerClock) {
  auto a = join("r", "a", 2, 2);
  auto b = join("r", "b", 2, 2);
  ASSERT_TRUE(resolved(a) && resolved(b));
  advance(seconds(20));
  ASSERT_TRUE(state_.heartbeat("r", "a", 0, now_).ok());
  EXPECT_EQ(*state_.nextDeadline(), t0_ + seconds(30));
  advance(seconds(9));
  EXPECT_TRUE(invalidated_.empty());
  advance(seconds(1));
  ASSERT_EQ(invalidated_.size(), 1u);
  EXPECT_THAT(invalidated_[0].reason, HasSubstr("'b' evicted: no heartbeat for 30s (window 30s)"));
  auto st = state_.heartbeat("r", "a", 0, now_);
  EXPECT_EQ(st.code, RdzvCode::kFailedPrecondition);
  EXPECT_THAT(st.message, HasSubstr("round 0 of run 'r' is no longer current"));
  EXPECT_EQ(state_.status("r")->round, 1);
}

TEST_F(StateTest, BrokenStreamEvictsOnlyWhileItsRoundIsCurrent) {
  auto a = join("r", "a", 2, 2);
  auto b = join("r", "b", 2, 2);
  ASSERT_TRUE(resolved(a) && resolved(b));
  Effects fx;
  state_.nodeLost("r", "b", 0, "watch stream broke", now_, fx);
  absorb(fx);
  ASSERT_EQ(invalidated_.size(), 1u);
  EXPECT_THAT(invalidated_[0].reason, HasSubstr("'b' evicted: watch stream broke"));
  Effects fx2;
  state_.nodeLost("r", "a", 0, "watch stream broke", now_, fx2);  // round 0 is over already
  EXPECT_TRUE(fx2.invalidated.empty());
}

TEST_F(StateTest, CancelledJoinerLeavesTheRoundAndStopsTheLastCall) {
  auto a = join("r", "a", 2, 3);
  auto b = join("r", "b", 2, 3);
  EXPECT_TRUE(state_.nextDeadline().has_value());
  Effects fx;
  state_.cancelJoin(b, now_, fx);
  absorb(fx);
  EXPECT_FALSE(resolved(b)) << "a cancelled call gets no outcome";
  EXPECT_EQ(state_.status("r")->joining, 1);
  advance(seconds(10));
  EXPECT_FALSE(resolved(a)) << "below min again: the last call must not fire";
  join("r", "b", 2, 3);  // the same id may come back
  advance(seconds(10));
  EXPECT_TRUE(outcome(a).status.ok());
}

TEST_F(StateTest, LeaveWhileJoiningCancelsThatJoinAndUnknownIsNotFound) {
  auto a = join("r", "a", 2, 2);
  Effects fx;
  EXPECT_TRUE(state_.leave("r", "a", now_, fx).ok());
  absorb(fx);
  EXPECT_EQ(outcome(a).status.code, RdzvCode::kCancelled);
  EXPECT_EQ(state_.leave("r", "zz", now_, fx).code, RdzvCode::kNotFound);
  EXPECT_EQ(state_.leave("nope", "a", now_, fx).code, RdzvCode::kNotFound);
}

TEST_F(StateTest, MemberRejoiningStartsANewRoundForAll) {
  join("r", "a", 2, 2);
  join("r", "b", 2, 2);
  auto a2 = join("r", "a", 2, 2);
  ASSERT_EQ(invalidated_.size(), 1u);
  EXPECT_THAT(invalidated_[0].reason, HasSubstr("'a' re-joined"));
  EXPECT_FALSE(resolved(a2));
  auto b2 = join("r", "b", 2, 2);
  EXPECT_EQ(outcome(a2).round->round, 1);
  EXPECT_EQ(outcome(b2).group_rank, 1);
}

TEST_F(StateTest, RunsAreIsolated) {
  auto a = join("r1", "a", 1, 1);
  auto a2 = join("r2", "a", 2, 2, 1, "9.9");  // same node id, other shape and version
  EXPECT_TRUE(outcome(a).status.ok());
  EXPECT_FALSE(resolved(a2));
  EXPECT_EQ(state_.status("r2")->joining, 1);
}

TEST_F(StateTest, RanksAreDeterministicForAMembership) {
  std::vector<std::string> ids;
  for (int i = 0; i < 50; ++i) ids.push_back("node-" + std::to_string(i));
  std::vector<std::vector<int32_t>> seen;
  std::mt19937 rng(7);
  for (int trial = 0; trial < 3; ++trial) {
    std::shuffle(ids.begin(), ids.end(), rng);
    std::string run = "run" + std::to_string(trial);
    std::map<std::string, JoinTicket> t;
    for (auto& id : ids) t[id] = join(run, id, 50, 50, 1 + static_cast<int>(id.size() % 3));
    std::vector<int32_t> ranks;
    for (auto& [id, ticket] : t) ranks.push_back(outcome(ticket).group_rank);
    seen.push_back(ranks);
  }
  EXPECT_EQ(seen[0], seen[1]);
  EXPECT_EQ(seen[1], seen[2]);
}

// ---- fast re-formation: the nodes expected back complete the round without a last call ---

TEST_F(StateTest, CrashOfOneOfThreeSurvivorsReformWithoutLastCall) {
  auto a = join("r", "a", 2, 3);
  auto b = join("r", "b", 2, 3);
  auto c = join("r", "c", 2, 3);
  ASSERT_TRUE(outcome(a).status.ok() && outcome(b).status.ok() && outcome(c).status.ok());
  Effects fx;
  state_.nodeLost("r", "c", 0, "its watch stream broke", now_, fx);
  absorb(fx);
  ASSERT_EQ(invalidated_.size(), 1u);
  EXPECT_EQ(state_.status("r")->expected, 2);
  advance(milliseconds(100));
  auto a1 = join("r", "a", 2, 3);
  EXPECT_FALSE(resolved(a1)) << "'b' is still expected";
  advance(milliseconds(100));
  auto b1 = join("r", "b", 2, 3);
  ASSERT_TRUE(resolved(a1) && resolved(b1)) << "no last call once every survivor is back";
  ASSERT_TRUE(outcome(a1).status.ok()) << outcome(a1).status.message;
  EXPECT_EQ(outcome(a1).round->round, 1);
  EXPECT_EQ(outcome(a1).round->nodes.size(), 2u);
  EXPECT_EQ(outcome(b1).group_rank, 1);
  EXPECT_EQ(state_.status("r")->phase, RendezvousState::Phase::kComplete);
  EXPECT_EQ(state_.status("r")->expected, 0);

  // The lost node comes back later: it waits, the round has room, so all three re-form at
  // once (c is expected as a waiter, a and b as survivors).
  auto c2 = join("r", "c", 2, 3);
  EXPECT_FALSE(resolved(c2));
  ASSERT_EQ(invalidated_.size(), 2u);
  auto a2 = join("r", "a", 2, 3);
  EXPECT_FALSE(resolved(c2));
  auto b2 = join("r", "b", 2, 3);  // max reached as well here
  ASSERT_TRUE(resolved(a2) && resolved(b2) && resolved(c2));
  EXPECT_EQ(outcome(c2).round->round, 2);
  EXPECT_EQ(outcome(c2).round->nodes.size(), 3u);
}

TEST_F(StateTest, WaitingFourthNodeIsAdmittedAndAllFourCompleteAtOnce) {
  auto a = join("r", "a", 2, 5);
  auto b = join("r", "b", 2, 5);
  auto c = join("r", "c", 2, 5);
  advance(seconds(10));  // the first round of a run keeps its last call
  ASSERT_TRUE(outcome(a).status.ok() && outcome(b).status.ok() && outcome(c).status.ok());
  auto d = join("r", "d", 2, 5);
  ASSERT_EQ(invalidated_.size(), 1u);
  EXPECT_THAT(invalidated_[0].reason, HasSubstr("'d' wants to join"));
  EXPECT_EQ(state_.status("r")->expected, 4);
  auto a1 = join("r", "a", 2, 5);
  auto b1 = join("r", "b", 2, 5);
  EXPECT_FALSE(resolved(d) || resolved(a1) || resolved(b1)) << "'c' is still expected";
  auto c1 = join("r", "c", 2, 5);
  for (auto t : {a1, b1, c1, d}) {
    ASSERT_TRUE(resolved(t));
    ASSERT_TRUE(outcome(t).status.ok()) << outcome(t).status.message;
  }
  EXPECT_EQ(outcome(d).round->round, 1);
  EXPECT_EQ(outcome(d).round->nodes.size(), 4u);
  EXPECT_EQ(outcome(d).group_rank, 3);
}

TEST_F(StateTest, MemberRejoiningToRestartItsWorkersReformsAtOnce) {
  auto a = join("r", "a", 2, 4);
  auto b = join("r", "b", 2, 4);
  auto c = join("r", "c", 2, 4);
  advance(seconds(10));
  ASSERT_TRUE(outcome(a).status.ok() && outcome(b).status.ok() && outcome(c).status.ok());
  auto b1 = join("r", "b", 2, 4);  // b's workers failed: it restarts them
  ASSERT_EQ(invalidated_.size(), 1u);
  EXPECT_THAT(invalidated_[0].reason, HasSubstr("'b' re-joined"));
  EXPECT_EQ(state_.status("r")->expected, 3);
  auto a1 = join("r", "a", 2, 4);
  EXPECT_FALSE(resolved(a1) || resolved(b1));
  auto c1 = join("r", "c", 2, 4);
  ASSERT_TRUE(resolved(a1) && resolved(b1) && resolved(c1));
  EXPECT_EQ(outcome(b1).round->round, 1);
  EXPECT_EQ(outcome(b1).round->nodes.size(), 3u);
  EXPECT_EQ(outcome(c1).group_rank, 2);
}

TEST_F(StateTest, ExpectedNodeThatNeverComesBackLeavesTheLastCallInCharge) {
  for (auto n : {"a", "b", "c", "d"}) join("r", n, 2, 5);
  advance(seconds(10));
  ASSERT_EQ(state_.status("r")->phase, RendezvousState::Phase::kComplete);
  Effects fx;
  state_.nodeLost("r", "d", 0, "its watch stream broke", now_, fx);
  absorb(fx);
  auto a1 = join("r", "a", 2, 5);
  auto b1 = join("r", "b", 2, 5);  // min reached; 'c' is expected but never re-joins
  // The last call would end in 10 s, but c, last heard of when round 0 completed (now), may
  // train until its heartbeat window of 30 s runs out.
  ASSERT_TRUE(state_.nextDeadline().has_value());
  EXPECT_EQ(*state_.nextDeadline(), now_ + seconds(30));
  advance(milliseconds(29999));
  EXPECT_FALSE(resolved(a1));
  advance(milliseconds(1));
  ASSERT_TRUE(resolved(a1) && resolved(b1));
  EXPECT_EQ(outcome(a1).round->nodes.size(), 2u);

  // Below min, an expected node that never re-joins leaves the join timeout in charge.
  Effects fx2;
  state_.nodeLost("r", "b", 1, "its watch stream broke", now_, fx2);
  absorb(fx2);
  auto c2 = join("r", "c", 2, 5);  // c comes back but a never does: 1/2 nodes
  advance(seconds(59));
  EXPECT_FALSE(resolved(c2));
  advance(seconds(1));
  ASSERT_TRUE(resolved(c2));
  EXPECT_EQ(outcome(c2).status.code, RdzvCode::kDeadlineExceeded);
  EXPECT_EQ(state_.status("r")->expected, 0) << "a failed round starts over as a fresh one";
}

TEST_F(StateTest, ExpectedJoinerThatGoesAwayIsNoLongerAwaited) {
  for (auto n : {"a", "b", "c", "d"}) join("r", n, 2, 5);
  advance(seconds(10));
  Effects fx;
  state_.nodeLost("r", "d", 0, "its watch stream broke", now_, fx);
  absorb(fx);
  auto a1 = join("r", "a", 2, 5);
  auto b1 = join("r", "b", 2, 5);
  auto c1 = join("r", "c", 2, 5);
  EXPECT_TRUE(resolved(a1) && resolved(b1) && resolved(c1));
  // Round 1 = {a, b, c}; c restarts, a re-joins, then c's join call goes away: only a and b
  // are still expected, so b's arrival completes the round.
  auto c2 = join("r", "c", 2, 5);
  auto a2 = join("r", "a", 2, 5);
  Effects fx2;
  state_.cancelJoin(c2, now_, fx2);
  absorb(fx2);
  EXPECT_FALSE(resolved(a2));
  auto b2 = join("r", "b", 2, 5);
  ASSERT_TRUE(resolved(a2) && resolved(b2));
  EXPECT_EQ(outcome(a2).round->nodes.size(), 2u);

  // An expected node that leaves instead of re-joining is not awaited either.
  Effects fx3;
  state_.nodeLost("r", "b", 2, "its watch stream broke", now_, fx3);  // round 3 expects a
  absorb(fx3);
  auto c3 = join("r", "c", 2, 5);
  auto d3 = join("r", "d", 2, 5);
  auto a3 = join("r", "a", 2, 5);
  ASSERT_TRUE(resolved(a3) && resolved(c3) && resolved(d3)) << "lost nodes may come back early";
  EXPECT_EQ(outcome(c3).round->nodes.size(), 3u);
  Effects fx4;
  state_.nodeLost("r", "d", 3, "its watch stream broke", now_, fx4);  // round 4 expects a, c
  absorb(fx4);
  auto a4 = join("r", "a", 2, 5);
  auto b4 = join("r", "b", 2, 5);
  EXPECT_FALSE(resolved(a4)) << "'c' is still expected";
  Effects fx5;
  EXPECT_TRUE(state_.leave("r", "c", now_, fx5).ok());
  absorb(fx5);
  ASSERT_TRUE(resolved(a4) && resolved(b4));
  EXPECT_EQ(outcome(a4).round->round, 4);
  EXPECT_EQ(outcome(a4).round->nodes.size(), 2u);
}

// 100,000 single-rank nodes form one round, one stops heartbeating and is evicted, the rest
// re-form without it. Exercises the data structures at the scale a big job would need.
// Issue 11: local world sizes summing past INT32_MAX gave every node a negative world size.
TEST_F(StateTest, WorldSizePastInt32IsRefusedNamingTheNumbers) {
  auto a = join("r", "a", 2, 3, INT32_MAX - 5);
  auto b = join("r", "b", 2, 3, 6);  // would make 2147483648
  ASSERT_TRUE(resolved(b));
  EXPECT_EQ(outcome(b).status.code, RdzvCode::kFailedPrecondition);
  EXPECT_THAT(outcome(b).status.message, HasSubstr("world size 2147483648"));
  EXPECT_THAT(outcome(b).status.message, HasSubstr("2147483647"));
  auto c = join("r", "c", 2, 3, 5);  // exactly INT32_MAX: fine
  advance(seconds(10));              // last call
  ASSERT_TRUE(resolved(a) && resolved(c));
  ASSERT_TRUE(outcome(a).status.ok());
  EXPECT_EQ(outcome(a).round->world_size, INT32_MAX);
  EXPECT_EQ(outcome(c).round->rank_offsets[1], INT32_MAX - 5);
}

TEST_F(StateTest, ReJoiningMemberIsNotCountedTwiceInTheWorldBound) {
  auto a = join("r", "a", 2, 2, INT32_MAX / 2);
  auto b = join("r", "b", 2, 2, INT32_MAX / 2);
  ASSERT_TRUE(outcome(a).status.ok() && outcome(b).status.ok());
  auto a2 = join("r", "a", 2, 2, INT32_MAX / 2);  // restarting its workers
  auto b2 = join("r", "b", 2, 2, INT32_MAX / 2);
  ASSERT_TRUE(resolved(a2) && resolved(b2));
  EXPECT_TRUE(outcome(b2).status.ok()) << outcome(b2).status.message;
}

// Issue 11: a join timeout near INT64_MAX ms wrapped now + timeout into the past and failed
// the round at once; it means "wait very long".
TEST_F(StateTest, Int64MaxTimeoutsMeanWaitVeryLong) {
  const Duration huge{std::numeric_limits<int64_t>::max()};
  auto a = join("r", "a", 2, 3, 1, "1.0", huge, huge);
  advance(std::chrono::hours(24 * 365));
  EXPECT_FALSE(resolved(a)) << outcome(a).status.message;
  auto b = join("r", "b", 2, 3, 1, "1.0", huge, huge);
  advance(std::chrono::hours(24 * 365));
  EXPECT_FALSE(resolved(a)) << "the last call is very long too";
  auto c = join("r", "c", 2, 3, 1, "1.0", huge, huge);  // max nodes: complete at once
  ASSERT_TRUE(resolved(a) && resolved(b) && resolved(c));
  EXPECT_TRUE(outcome(a).status.ok());
}

// Issue 33: a node stopped by its preflight before joining a job of a fixed 2 nodes. The node
// waiting in the forming round used to wait out the join timeout ("1/2 nodes joined"); it
// fails at once with the stopped node's reason, and so does a node that comes later within a
// join timeout of the stop. Past that window the run can form again (a fresh start).
TEST_F(StateTest, NodeStoppedBeforeJoiningFailsAFixedSizeRoundAtOnceWithItsReason) {
  auto a = join("r", "a", 2, 2);
  Effects fx;
  RendezvousState::Withdrawal w;
  JoinSpec stop{"r", {"b", 1, "", ""}, {2, 2, seconds(60), seconds(10)}};
  ASSERT_TRUE(state_.withdraw(stop, "preflight on hostb failed: fail NCCL_SOCKET_IFNAME", now_,
                              fx, &w)
                  .ok());
  absorb(fx);
  EXPECT_TRUE(w.failed);
  EXPECT_EQ(w.stopped, 1);
  EXPECT_EQ(w.can_come, 1);
  ASSERT_TRUE(resolved(a));
  EXPECT_EQ(outcome(a).status.code, RdzvCode::kFailedPrecondition);
  EXPECT_THAT(outcome(a).status.message,
              HasSubstr("node 'b' stopped before joining: preflight on hostb failed: fail "
                        "NCCL_SOCKET_IFNAME"));
  EXPECT_THAT(outcome(a).status.message,
              HasSubstr("round 0 needs at least 2 of 2 nodes and at most 1 can still come"));
  advance(seconds(30));
  auto c = join("r", "c", 2, 2);  // came later, within the window
  ASSERT_TRUE(resolved(c));
  EXPECT_THAT(outcome(c).status.message, HasSubstr(kStoppedBeforeJoining));
  advance(seconds(31));  // past the window: a fresh start forms
  auto d = join("r", "d", 2, 2), e = join("r", "e", 2, 2);
  ASSERT_TRUE(resolved(d) && resolved(e));
  EXPECT_TRUE(outcome(d).status.ok()) << outcome(d).status.message;
}

// With min:max where the rest can still form, a stop fails nothing: the round waits for no
// more nodes than can still come (no last call for a node that will not), and the running
// round is not disturbed by a stop; the next round is not held to an old one.
TEST_F(StateTest, NodeStoppedBeforeJoiningAnElasticJobTheOthersFormWithoutIt) {
  auto a = join("r", "a", 1, 3);
  auto b = join("r", "b", 1, 3);
  EXPECT_FALSE(resolved(a));  // in its last call, waiting for a third
  Effects fx;
  RendezvousState::Withdrawal w;
  JoinSpec stop{"r", {"c", 1, "", ""}, {1, 3, seconds(60), seconds(10)}};
  ASSERT_TRUE(state_.withdraw(stop, "preflight failed", now_, fx, &w).ok());
  absorb(fx);
  EXPECT_FALSE(w.failed);
  EXPECT_EQ(w.can_come, 2);
  ASSERT_TRUE(resolved(a) && resolved(b)) << "both nodes that can come are in: no last call";
  EXPECT_TRUE(outcome(a).status.ok()) << outcome(a).status.message;
  EXPECT_EQ(outcome(a).round->nodes.size(), 2u);
  // A stop while the round runs: nothing changes; and a 3rd node still gets in next.
  JoinSpec late{"r", {"d", 1, "", ""}, {1, 3, seconds(60), seconds(10)}};
  Effects fx2;
  ASSERT_TRUE(state_.withdraw(late, "preflight failed", now_, fx2, &w).ok());
  absorb(fx2);
  EXPECT_TRUE(invalidated_.empty());
  EXPECT_EQ(w.can_come, 3);
  // A stop with another shape than the run's is refused, as a join would be.
  JoinSpec other{"r", {"e", 1, "", ""}, {2, 2, seconds(60), seconds(10)}};
  Effects fx3;
  EXPECT_EQ(state_.withdraw(other, "x", now_, fx3).code, RdzvCode::kFailedPrecondition);
}

// Issue 11: a long-lived server forgets runs nobody is in after the retention, and the cost
// of its timers does not grow with the runs that passed through it.
TEST(StateRetentionTest, EmptyRunsAreForgottenAfterTheRetentionAndTimersOnlyVisitDueRuns) {
  RendezvousState state{RendezvousStateOptions{seconds(30), seconds(60)}};
  TimePoint now = TimePoint{} + std::chrono::hours(1);
  Effects fx;
  for (int i = 0; i < 5000; ++i) {
    std::string run = "job" + std::to_string(i);
    state.join({run, {"n", 1, "1.0", "a"}, {1, 1, seconds(60), seconds(0)}}, now, fx);
    state.leave(run, "n", now, fx);
    now += milliseconds(20);  // 5000 jobs over 100 s
    state.tick(now, fx);
  }
  // Only the jobs of the last 60 s are left.
  EXPECT_LE(state.runCount(), 3001u);
  EXPECT_GE(state.runCount(), 2999u);
  // Each run was looked at about once (its retention), not once per tick.
  EXPECT_LE(state.runsVisited(), 2u * 5000);
  EXPECT_GE(fx.removed_runs.size(), 1999u);
  EXPECT_FALSE(state.status("job0").has_value());
  EXPECT_TRUE(state.status("job4999").has_value());
  now += seconds(61);
  state.tick(now, fx);
  EXPECT_EQ(state.runCount(), 0u);
  EXPECT_FALSE(state.nextDeadline().has_value());
}

TEST_F(StateTest, Simulation100kRanks) {
  constexpr int kNodes = 100000;
  std::vector<JoinTicket> tickets(kNodes);
  std::vector<std::string> ids(kNodes);
  for (int i = 0; i < kNodes; ++i) ids[i] = fmt::format("n{:06d}", i);
  for (int i = 0; i < kNodes; ++i)
    tickets[i] = join("big", ids[i], kNodes - 10, kNodes, 1, "1.0", seconds(5), seconds(600));
  std::vector<bool> rank_seen(kNodes, false);
  auto round0 = outcome(tickets[0]).round;
  ASSERT_EQ(round0->world_size, kNodes);
  for (int i = 0; i < kNodes; ++i) {
    const auto& o = outcome(tickets[i]);
    ASSERT_TRUE(o.status.ok());
    ASSERT_EQ(o.round.get(), round0.get());
    ASSERT_EQ(o.group_rank, i);  // ids sort in index order
    ASSERT_EQ(round0->rank_offsets[i], i);
    rank_seen[o.group_rank] = true;
  }
  EXPECT_TRUE(std::all_of(rank_seen.begin(), rank_seen.end(), [](bool b) { return b; }));

  advance(seconds(20));
  for (int i = 0; i < kNodes; ++i)
    if (i != 4242) ASSERT_TRUE(state_.heartbeat("big", ids[i], 0, now_).ok());
  advance(seconds(10));
  ASSERT_EQ(invalidated_.size(), 1u);
  EXPECT_THAT(invalidated_[0].reason, HasSubstr("'n004242'"));

  outcomes_.clear();
  EXPECT_EQ(state_.status("big")->expected, kNodes - 1);
  for (int i = 0; i < kNodes; ++i)
    if (i != 4242) tickets[i] = join("big", ids[i], kNodes - 10, kNodes, 1, "1.0", seconds(5));
  // Min reached, max not, but every survivor is back: no last call (fast re-formation).
  ASSERT_TRUE(resolved(tickets[0]));
  const auto& o = outcome(tickets[kNodes - 1]);
  ASSERT_TRUE(o.status.ok());
  EXPECT_EQ(o.round->round, 1);
  EXPECT_EQ(o.round->world_size, kNodes - 1);
  EXPECT_EQ(o.group_rank, kNodes - 2);
}

}  // namespace
}  // namespace ddpl::rdzv
