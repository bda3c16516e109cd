// One name for the rendezvous token in launch and rdzv-server (rendezvous/store/token.h); the old
// one still works, with a warning naming both.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "common/errors.h"
#include "rendezvous/store/token.h"

using ddpl::rdzv::rdzvTokenFromEnvironment;
using ::testing::HasSubstr;

TEST(RdzvToken, CanonicalNameIsReadQuietly) {
  auto t = rdzvTokenFromEnvironment({{"DDPL_RDZV_TOKEN", "s3cret"}}, "launch");
  ASSERT_TRUE(t.token);
  EXPECT_EQ(*t.token, "s3cret");
  EXPECT_EQ(t.warning, "");
  // The same value under both names is not worth a warning.
  t = rdzvTokenFromEnvironment({{"DDPL_RDZV_TOKEN", "s3cret"}, {"DDPL_STORE_TOKEN", "s3cret"}},
                               "launch");
  EXPECT_EQ(*t.token, "s3cret");
  EXPECT_EQ(t.warning, "");
}

TEST(RdzvToken, OldNameIsAcceptedWithAWarningNamingBoth) {
  auto t = rdzvTokenFromEnvironment({{"DDPL_STORE_TOKEN", "old"}}, "rdzv-server");
  ASSERT_TRUE(t.token);
  EXPECT_EQ(*t.token, "old");
  EXPECT_THAT(t.warning, HasSubstr("rdzv-server"));
  EXPECT_THAT(t.warning, HasSubstr("DDPL_STORE_TOKEN"));
  EXPECT_THAT(t.warning, HasSubstr("set DDPL_RDZV_TOKEN instead"));
}

TEST(RdzvToken, BothSetAndDifferentTheCanonicalWinsWithAWarning) {
  auto t =
      rdzvTokenFromEnvironment({{"DDPL_RDZV_TOKEN", "new"}, {"DDPL_STORE_TOKEN", "old"}}, "launch");
  EXPECT_EQ(*t.token, "new");
  EXPECT_THAT(t.warning, HasSubstr("DDPL_RDZV_TOKEN and DDPL_STORE_TOKEN are both set and differ"));
}

TEST(RdzvToken, InsideAWorkerTheOldNameIsTheWorkersTokenNotOurs) {
  // launch sets DDPL_STORE_ADDR with DDPL_STORE_TOKEN for its workers: a launch or server started
  // from a worker must not take that job's store token for its own secret.
  auto t = rdzvTokenFromEnvironment(
      {{"DDPL_STORE_TOKEN", "job"}, {"DDPL_STORE_ADDR", "10.0.0.1:29400"}}, "launch");
  EXPECT_FALSE(t.token);
  EXPECT_EQ(t.warning, "");
}

TEST(RdzvToken, EmptyCanonicalIsRefusedEmptyOldMeansNone) {
  try {
    rdzvTokenFromEnvironment({{"DDPL_RDZV_TOKEN", ""}}, "rdzv-server");
    FAIL();
  } catch (const ddpl::InvalidArgument& e) {
    EXPECT_THAT(e.what(), HasSubstr("DDPL_RDZV_TOKEN is set but empty"));
  }
  auto t = rdzvTokenFromEnvironment({{"DDPL_STORE_TOKEN", ""}}, "rdzv-server");
  EXPECT_FALSE(t.token);
  t = rdzvTokenFromEnvironment({}, "launch");
  EXPECT_FALSE(t.token);
  EXPECT_EQ(t.warning, "");
}
