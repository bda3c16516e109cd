// round_rules: when a forming round closes, and how a complete round's ranks are laid out.
#include <gtest/gtest.h>

#include "rendezvous/state/round_rules.h"

namespace ddpl::rdzv::round_rules {
namespace {

FormingRound forming(int joined, int min_nodes, int can_come, bool all_expected_back = false) {
  FormingRound r;
  r.joined = joined;
  r.min_nodes = min_nodes;
  r.can_come = can_come;
  r.all_expected_back = all_expected_back;
  return r;
}

TEST(RoundRules, BelowMinNodesTheRoundWaits) {
  EXPECT_EQ(closing(forming(1, 2, 4)), Closing::kNotYet);
  EXPECT_EQ(closing(forming(0, 1, 4)), Closing::kNotYet);
  // Expected nodes back do not close a round below min nodes.
  EXPECT_EQ(closing(forming(1, 2, 4, true)), Closing::kNotYet);
  EXPECT_FALSE(closesNow(Closing::kNotYet));
}

TEST(RoundRules, MinNodesInStartsTheLastCall) {
  EXPECT_EQ(closing(forming(2, 2, 4)), Closing::kLastCall);
  EXPECT_EQ(closing(forming(3, 2, 4)), Closing::kLastCall);
  EXPECT_FALSE(closesNow(Closing::kLastCall));
}

TEST(RoundRules, MaxNodesInClosesAtOnce) {
  EXPECT_EQ(closing(forming(4, 2, 4)), Closing::kEveryoneWhoCanCome);
  EXPECT_EQ(closing(forming(1, 1, 1)), Closing::kEveryoneWhoCanCome);
  EXPECT_TRUE(closesNow(Closing::kEveryoneWhoCanCome));
}

TEST(RoundRules, NodesThatStoppedBeforeJoiningAreNotWaitedFor) {
  // 4 max, one stopped: 3 can come, and 3 are in.
  EXPECT_EQ(closing(forming(3, 2, 3)), Closing::kEveryoneWhoCanCome);
  // Fewer than min can come: the round does not close (its counter fails it instead).
  EXPECT_EQ(closing(forming(1, 2, 1)), Closing::kNotYet);
}

TEST(RoundRules, EveryExpectedNodeBackClosesWithoutLastCall) {
  EXPECT_EQ(closing(forming(2, 2, 4, true)), Closing::kAllExpectedBack);
  EXPECT_TRUE(closesNow(Closing::kAllExpectedBack));
  // Max nodes wins over expected: the same outcome, closed now.
  EXPECT_EQ(closing(forming(4, 2, 4, true)), Closing::kEveryoneWhoCanCome);
}

TEST(RoundRules, RankOffsetsAreTheSumsOfTheNodesBefore) {
  RankLayout l = rankLayout({4, 2, 8});
  EXPECT_EQ(l.offsets, (std::vector<int64_t>{0, 4, 6}));
  EXPECT_EQ(l.world_size, 14);
  EXPECT_EQ(globalRank(l.offsets[2], 3), 9);
  RankLayout none = rankLayout({});
  EXPECT_TRUE(none.offsets.empty());
  EXPECT_EQ(none.world_size, 0);
}

TEST(RoundRules, RankLayoutDoesNotOverflowInt32Sums) {
  RankLayout l = rankLayout({INT32_MAX, INT32_MAX});
  EXPECT_EQ(l.offsets[1], INT32_MAX);
  EXPECT_EQ(l.world_size, 2 * static_cast<int64_t>(INT32_MAX));
}

}  // namespace
}  // namespace ddpl::rdzv::round_rules
