// Real PyTorch Python scripts, unchanged, under `launch` (the pinned torch from .venv).
#include <gtest/gtest.h>

#include <sstream>

#include "tests/common/subprocess.h"

using namespace ddpl::testing;
using namespace std::chrono_literals;

namespace {
const std::string kLaunch = std::string(DDPL_BIN_DIR) + "/launch";
const std::string kScripts = std::string(DDPL_SOURCE_DIR) + "/tests/python";
}  // namespace

TEST(LaunchPython, FourRankGlooDdpScriptRunsUnchanged) {
  RunOptions o;
  o.env["PYTHON_EXEC"] = DDPL_PYTHON;
  o.timeout = 300s;
  auto r = run({kLaunch, "--standalone", "--nproc-per-node=4", kScripts + "/ddp_gloo.py"}, o);
  ASSERT_EQ(r.exit_code, 0) << r.all();
  std::string checksum;
  for (int rank = 0; rank < 4; ++rank) {
    std::string tag = "[default" + std::to_string(rank) + "]:DDP OK rank=" + std::to_string(rank) +
                      " world=4 local_rank=" + std::to_string(rank) + " group_rank=0 checksum=";
    auto pos = r.out.find(tag);
    ASSERT_NE(pos, std::string::npos) << r.out;
    std::string sum = r.out.substr(pos + tag.size(), r.out.find('\n', pos) - pos - tag.size());
    if (rank == 0) checksum = sum;
    EXPECT_EQ(sum, checksum) << "ranks disagree after DDP training";
  }
}

TEST(LaunchPython, RecordDecoratorErrorReachesTheReport) {
  RunOptions o;
  o.env["PYTHON_EXEC"] = DDPL_PYTHON;
  o.timeout = 180s;
  auto r = run({kLaunch, "--nproc-per-node=2", kScripts + "/record_error.py"}, o);
  EXPECT_EQ(r.exit_code, 1) << r.all();
  auto pos = r.err.find("Root Cause");
  ASSERT_NE(pos, std::string::npos) << r.err;
  std::string root = r.err.substr(pos);
  EXPECT_NE(root.find("rank      : 1 (local_rank: 1)"), std::string::npos) << root;
  EXPECT_NE(root.find("ValueError: learning rate must be positive, got -0.5"), std::string::npos)
      << root;
  EXPECT_NE(root.find("traceback :"), std::string::npos) << root;
  EXPECT_NE(root.find("record_error.py"), std::string::npos) << root;
}
